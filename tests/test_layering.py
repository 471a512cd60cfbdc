"""The package's layering, checked on its source: no import circle inside ``runtime/`` or
``worker/``, the SQL dialect read only inside ``store/`` and a database driver imported only
by ``store/drivers``, no private name of SQLAlchemy, Celery changed only in
``worker/celery_hooks``, no module but the engine's reading its private attributes; in
``runtime/``, parts passed and never inherited, one interpreter of moves and no stubs;
node kinds told apart by ``match``; and every kind of outcome mapped to a Celery ending in
one place."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy
from celery.exceptions import Ignore, Retry

from celery_saga.errors import StepRetryRequested
from celery_saga.runtime import outcomes
from celery_saga.worker.endings import StepFailed, end_task

PACKAGE = Path(__file__).resolve().parent.parent / "celery_saga"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module of the package ``path`` imports, TYPE_CHECKING imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in visiting:
            return [*visiting[visiting.index(name) :], name]
        if name in done:
            return None
        visiting.append(name)
        for other in sorted(graph[name]):
            found = visit(other)
            if found:
                return found
        visiting.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        found = visit(name)
        if found:
            return found
    return None


def test_no_import_circle_inside_runtime() -> None:
    files = {_module_name(p): p for p in (PACKAGE / "runtime").glob("*.py")}
    graph = {name: _imports(path) & set(files) - {name} for name, path in files.items()}
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def _attribute_reads(path: Path, attribute: str) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == attribute
    ]


def test_only_the_store_reads_the_sql_dialect() -> None:
    readers = {
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if "store" not in path.relative_to(PACKAGE).parts[:1]
        for line in _attribute_reads(path, "dialect")
    }
    assert not readers, f"the SQL dialect is read outside store/: {sorted(readers)}"


def test_celery_is_changed_only_in_its_hooks_module() -> None:
    hooks = PACKAGE / "worker" / "celery_hooks.py"
    patches = []
    for path in PACKAGE.rglob("*.py"):
        if path == hooks:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in ("run", "retry"):
                    patches.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
                if isinstance(target, ast.Subscript) and "Panel" in ast.unparse(target):
                    patches.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        if "connect(" in path.read_text() and "celery.signals" in path.read_text():
            patches.append(f"{path.relative_to(PACKAGE)}: connects a Celery signal")
    assert not patches, f"Celery changed outside worker/celery_hooks.py: {patches}"


class _Task:
    """What ``end_task`` uses of a Celery task."""

    MaxRetriesExceededError = type("MaxRetriesExceededError", (Exception,), {})

    def __init__(self) -> None:
        self.events: list[str] = []

    def send_event(self, name: str, **_: Any) -> None:
        self.events.append(name)


def _ending(outcome: outcomes.Outcome, own_body: bool = True) -> Any:
    task = _Task()
    try:
        return ("returned", end_task(task, outcome, own_body=own_body, send_events=True))
    except BaseException as error:  # the ending is what is checked
        return ("raised", error)


def test_every_outcome_kind_has_an_ending() -> None:
    kinds = set(typing.get_args(outcomes.Outcome))
    samples: dict[type, outcomes.Outcome] = {
        outcomes.Ran: outcomes.Ran({"ok": 1}),
        outcomes.Retrying: outcomes.Retrying("attempt 1 failed", 2.0),
        outcomes.Failed: outcomes.Failed("attempt 2 failed"),
        outcomes.TakenOver: outcomes.TakenOver("taken over", {"ok": 2}),
        outcomes.NoBody: outcomes.NoBody("duplicate"),
        outcomes.Stopped: outcomes.Stopped("stopped by the run's cancel"),
        outcomes.Interrupted: outcomes.Interrupted("shutdown", SystemExit(-241)),
    }
    assert kinds == set(samples), "a new outcome kind needs a case in worker/endings.py"
    assert _ending(samples[outcomes.Ran]) == ("returned", {"ok": 1})
    assert _ending(samples[outcomes.TakenOver]) == ("returned", {"ok": 2})
    assert isinstance(_ending(samples[outcomes.Retrying])[1], Retry)
    assert isinstance(_ending(samples[outcomes.Failed])[1], StepFailed)
    assert isinstance(_ending(samples[outcomes.NoBody])[1], Ignore)
    assert _ending(samples[outcomes.NoBody], own_body=False) == ("returned", None)
    for own_body in (True, False):
        assert isinstance(_ending(samples[outcomes.Stopped], own_body)[1], Ignore)
    stopped = samples[outcomes.Interrupted]
    assert isinstance(stopped, outcomes.Interrupted)
    assert _ending(stopped)[1] is stopped.error, "the pool must see its own SystemExit"
    cleanup = outcomes.Interrupted("shutdown", RuntimeError("connection closed in a finally"))
    ending = _ending(cleanup)[1]
    assert isinstance(ending, SystemExit), "an interrupted job is lost, never FAILURE"
    assert ending.__cause__ is cleanup.error


@pytest.mark.parametrize("kind", [outcomes.Retrying, outcomes.Failed])
def test_a_failed_attempt_ends_with_the_bodys_own_exception(kind: type) -> None:
    error = ValueError("card declined")
    outcome = (
        kind("attempt 1 failed", 1.0, error)
        if kind is outcomes.Retrying
        else kind("attempt 1 failed", error)
    )
    assert _ending(outcome)[1] is error


def test_self_retry_ends_as_retry_and_its_last_attempt_as_max_retries() -> None:
    asked = StepRetryRequested(None, 3.0, 2)
    ending = _ending(outcomes.Retrying("attempt 1 failed", 3.0, asked))[1]
    assert isinstance(ending, Retry)
    last = _ending(outcomes.Failed("attempt 3 failed", asked))[1]
    assert type(last).__name__ == "MaxRetriesExceededError"
    assert "max_retries=2" in str(last)


def test_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(AssertionError, match="unhandled"):
        end_task(SimpleNamespace(), object(), own_body=True, send_events=False)  # type: ignore[arg-type]


def test_a_stopped_body_sends_nothing_above_its_revoke_and_a_duplicate_still_succeeds() -> None:
    """Flower ranks SUCCESS and FAILURE above REVOKED: a body the cancel's revoke stopped
    sends no ending of its own; a message that ran nothing still leaves no task STARTED."""
    for own_body in (True, False):
        stopped = _Task()
        with pytest.raises(Ignore):
            end_task(stopped, outcomes.Stopped("cancelled"), own_body=own_body, send_events=True)
        assert stopped.events == []
    duplicate = _Task()
    with pytest.raises(Ignore):
        end_task(duplicate, outcomes.NoBody("duplicate"), own_body=True, send_events=True)
    assert duplicate.events == ["task-succeeded"]


# -- the store's statements: SQLAlchemy's public API only, database drivers in drivers/ ----

#: A name a package defines: a method, an attribute set on ``self``, a class-level name.
_DEFINED = re.compile(r"(?:\bdef\s+|\bself\.|^[ \t]+)(_[A-Za-z]\w*)\s*[(:=]", re.M)
#: Database drivers: only ``store/drivers/`` may import them.
_DRIVERS = ("psycopg", "psycopg2", "sqlite3", "pymysql", "MySQLdb")


def _underscore_names(root: Path) -> set[str]:
    """Underscore-prefixed (not dunder) names defined by the package below ``root``."""
    return {
        name
        for path in root.rglob("*.py")
        for name in _DEFINED.findall(path.read_text(encoding="utf-8"))
        if not name.startswith("__")
    }


def _sqlalchemy_private() -> set[str]:
    """SQLAlchemy's private names that this package does not define itself."""
    root = Path(sqlalchemy.__file__).parent
    return _underscore_names(root) - _underscore_names(PACKAGE)


def _private_uses(source: str, private: set[str]) -> list[str]:
    """Where ``source`` imports a private SQLAlchemy name or module, or reads (also through
    ``getattr``) an attribute named as one of ``private``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            names = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
            found += [f"{node.lineno}: import {n}" for n in names if n.startswith("_")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "sqlalchemy" and any(p.startswith("_") for p in parts):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_private_name_of_sqlalchemy_is_used() -> None:
    private = _sqlalchemy_private()
    assert {"_cached_bind_processor", "_result_columns", "_type_memos"} <= private
    uses = {
        f"{path.relative_to(PACKAGE)}:{use}"
        for path in PACKAGE.rglob("*.py")
        for use in _private_uses(path.read_text(encoding="utf-8"), private)
    }
    assert not uses, f"SQLAlchemy's private API is used: {sorted(uses)}"


def test_the_private_name_finder_finds_each_form() -> None:
    source = (
        "from sqlalchemy.sql.base import _generative\n"
        "import sqlalchemy.engine._processors\n"
        "processor = column.type._cached_bind_processor(dialect)\n"
        "columns = getattr(compiled, '_result_columns')\n"
        "fine = compiled.positiontup\n"
    )
    uses = _private_uses(source, {"_cached_bind_processor", "_result_columns"})
    assert sorted(int(use.split(":")[0]) for use in uses) == [1, 2, 3, 4]


def test_only_the_store_drivers_import_a_database_driver() -> None:
    drivers = PACKAGE / "store" / "drivers"
    importers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if drivers not in path.parents
        and any(name.split(".")[0] in _DRIVERS for name in _imports(path))
    }
    assert not importers, f"a database driver is imported outside store/drivers/: {importers}"


# -- the worker takes its parts, not the engine -----------------------------------------
_ENGINE_MODULE = PACKAGE / "worker" / "engine.py"


def _engine_private_reads(source: str) -> list[str]:
    """Each ``<an engine>._name`` in ``source``: a private attribute read through a name
    that says it is an engine (``engine``, ``self.engine``, ``_engine()``,
    ``SagaEngine.of(app)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        receiver = ast.unparse(node.value)
        if receiver.lower().removesuffix("()").endswith("engine") or "SagaEngine" in receiver:
            found.append(f"{receiver}.{node.attr}:{node.lineno}")
    return found


def test_no_module_reads_a_private_attribute_of_the_engine() -> None:
    readers = {
        f"{path.relative_to(PACKAGE)}: {read}"
        for path in PACKAGE.rglob("*.py")
        if path != _ENGINE_MODULE
        for read in _engine_private_reads(path.read_text())
    }
    assert not readers, f"the engine's private attributes read outside it: {sorted(readers)}"


def test_the_private_read_finder_finds_one() -> None:
    source = "engine._store('x', f)\nself.engine._launch()\n_engine()._x\nengine.db\nengine.__doc__"
    assert sorted(_engine_private_reads(source)) == [
        "_engine()._x:3",
        "engine._store:1",
        "self.engine._launch:2",
    ]


def test_no_import_circle_inside_worker() -> None:
    files = {_module_name(p): p for p in (PACKAGE / "worker").glob("*.py")}
    graph = {name: _imports(path) & set(files) - {name} for name, path in files.items()}
    assert _cycle(graph) is None


def test_no_worker_module_imports_the_engine() -> None:
    """The engine builds the worker's parts and hands them out: a module that imports it
    (``TYPE_CHECKING`` included) is one that reaches back into it."""
    engine = _module_name(_ENGINE_MODULE)
    importers = [
        path.name
        for path in (PACKAGE / "worker").glob("*.py")
        if path != _ENGINE_MODULE and engine in _imports(path)
    ]
    assert not importers, f"worker modules importing worker/engine.py: {importers}"


# -- the runtime: parts passed, moves returned, carried out in one place ----------------------


def _runtime_modules() -> list[Any]:
    import importlib

    return [
        importlib.import_module(_module_name(path))
        for path in sorted((PACKAGE / "runtime").glob("*.py"))
    ]


def test_no_runtime_class_inherits_from_a_class_of_the_package() -> None:
    """The runtime is composed over one frozen value of parts, never a base class: a
    class whose methods reach a sibling file's through its MRO is the shape to avoid."""
    import inspect

    inherited = []
    for module in _runtime_modules():
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            for base in cls.__mro__[1:]:
                if base.__module__.split(".")[0] == "celery_saga":
                    inherited.append(f"{module.__name__}.{name}({base.__qualname__})")
    assert not inherited, f"runtime classes built on the package's own classes: {inherited}"


def _move_matches(tree: ast.AST, kinds: set[str]) -> list[ast.Match]:
    """The ``match`` statements with a case over a kind of move."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Match):
            continue
        named = {
            sub.cls.id
            for case in node.cases
            for sub in ast.walk(case.pattern)
            if isinstance(sub, ast.MatchClass) and isinstance(sub.cls, ast.Name)
        }
        if named & kinds:
            found.append(node)
    return found


def test_one_interpreter_carries_every_kind_of_move_out() -> None:
    """Exactly one ``match`` over moves in ``runtime/``: one case per kind, and a last
    ``case _`` through ``unreachable``, so mypy flags a kind left unhandled."""
    from celery_saga.runtime import moves

    kinds = {kind.__name__ for kind in typing.get_args(moves.Move)}
    matches = {
        f"{path.name}:{match.lineno}": match
        for path in sorted((PACKAGE / "runtime").glob("*.py"))
        for match in _move_matches(ast.parse(path.read_text()), kinds)
    }
    assert len(matches) == 1, f"moves are matched in more than one place: {sorted(matches)}"
    (match,) = matches.values()
    cased = {
        sub.cls.id
        for case in match.cases
        for sub in ast.walk(case.pattern)
        if isinstance(sub, ast.MatchClass) and isinstance(sub.cls, ast.Name)
    }
    assert cased == kinds, f"kinds of move with no case: {sorted(kinds - cased)}"
    last = match.cases[-1]
    assert isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None
    assert "unreachable(" in ast.unparse(last.body[0])


def test_no_runtime_stub_waits_for_another_half() -> None:
    """No ``raise NotImplementedError`` standing for a method a subclass supplies."""
    stubs = [
        f"{path.name}:{node.lineno}"
        for path in sorted((PACKAGE / "runtime").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name) and node.id == "NotImplementedError"
    ]
    assert not stubs, f"stubs in runtime/: {stubs}"


NODE_KINDS = {
    "StepNode",
    "ParallelNode",
    "BranchNode",
    "PivotNode",
    "WaitNode",
    "SubSagaNode",
    "LoopNode",
    "ForEachNode",
}


def _kinds_tested(call: ast.Call) -> set[str]:
    """The node kinds an ``isinstance(x, K)`` or ``isinstance(x, (K, L))`` call tests."""
    if (
        not (isinstance(call.func, ast.Name) and call.func.id == "isinstance")
        or len(call.args) != 2
    ):
        return set()
    tested = call.args[1]
    names = tested.elts if isinstance(tested, ast.Tuple) else [tested]
    found = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in names}
    return found & NODE_KINDS


def test_node_kinds_are_dispatched_by_match_not_by_isinstance_ladders() -> None:
    """A function that tells node kinds apart does it in one ``match`` (exhaustive where
    every kind matters), so a new kind is flagged by mypy where it is left unhandled; one
    ``isinstance`` filter (``if isinstance(node, (StepNode, ParallelNode))``) is not a
    ladder, two tests of node kinds in one function are."""
    ladders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            tests = [
                sorted(kinds)
                for call in ast.walk(function)
                if isinstance(call, ast.Call) and (kinds := _kinds_tested(call))
            ]
            if len(tests) > 1:
                where = f"{path.relative_to(PACKAGE.parent)}:{function.lineno}"
                ladders.append(f"{where} {function.name}: {tests}")
    assert not ladders, "isinstance ladders over node kinds:\n" + "\n".join(ladders)


# -- the views: one read API under every one of them -------------------------------------
#: The packages that show runs to people: ``celery saga ...``, the web view, the Django admin.
_VIEWS = ("cli", "web", "contrib")
#: Modules of those that administer the store rather than show runs: the schema commands,
#: key rotation, and the decoding of the blobs the Django models read.
_STORE_ADMINISTRATION = {
    "cli/db.py",
    "cli/payload_keys.py",
    "contrib/django/payloads.py",
}


def _store_reads(source: str) -> list[str]:
    """Where ``source`` imports the store (``celery_saga.store...``) or reads an engine's
    database (``.db``): a view that queries the store past the read API."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = []
        if isinstance(node, ast.Attribute) and node.attr == "db":
            found.append(f"{node.lineno}: .db")
        store = [n for n in names if n == "celery_saga.store" or n.startswith("celery_saga.store.")]
        if store:
            found.append(f"{node.lineno}: import {store[0]}")
    return found


def test_the_store_read_finder_finds_each_form() -> None:
    source = (
        "from celery_saga.store import inspection\n"
        "import celery_saga.store.history\n"
        "rows = engine.db.read(query)\n"
        "from celery_saga.inspect import Inspector\n"
        "view = engine.inspect().run('x')\n"
    )
    assert [use.split(":")[0] for use in _store_reads(source)] == ["1", "2", "3"]


def _view_modules() -> list[Path]:
    return [
        path
        for package in _VIEWS
        for path in sorted((PACKAGE / package).rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in _STORE_ADMINISTRATION
        and "migrations" not in path.parts  # Django's schema history, no view
    ]


def test_no_view_queries_the_store_directly() -> None:
    """``celery saga list/show/stats``, the web view and the Django admin read runs through
    the read API (``celery_saga.inspect``); none imports the store or reads ``engine.db``."""
    readers = {
        f"{path.relative_to(PACKAGE)}:{use}"
        for path in _view_modules()
        for use in _store_reads(path.read_text())
    }
    assert not readers, f"views reading the store past the read API: {sorted(readers)}"


def test_the_web_view_never_imports_the_cli() -> None:
    """The web view renders the read API; nothing of it runs back up through ``cli/``."""
    importers = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / "web").rglob("*.py")
        for name in _imports(path)
        if name == "celery_saga.cli" or name.startswith("celery_saga.cli.")
    }
    assert not importers, f"web/ imports cli/: {sorted(importers)}"


def test_no_loose_dict_crosses_from_the_read_api() -> None:
    """What ``celery_saga.inspect`` hands a view is typed: no public function or method of
    it returns ``dict[str, Any]`` (or ``Any``); payloads stay ``Any`` inside frozen values."""
    loose = []
    for path in sorted((PACKAGE / "inspect").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_") or node.returns is None:
                continue
            returned = ast.unparse(node.returns)
            if re.search(r"\bAny\b", returned):
                loose.append(f"inspect/{path.name}:{node.lineno} {node.name} -> {returned}")
    assert not loose, f"the read API hands out untyped values: {loose}"
