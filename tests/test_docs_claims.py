"""What the pages say Flower, the logs and the CLI show is backed by tests the pages name
(``<!-- checked by tests/test_x.py::test_name -->`` in their source), and every name they
give is a test that exists; the README states no benchmark figure that could go stale; the
pages that speak of a changed definition say the same thing about it."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: A comment of its own line (a page may show the syntax inline, as contributing.md does).
_CHECKED_BY = re.compile(r"^<!--\s*checked by\s+(.*?)\s*-->", re.DOTALL | re.MULTILINE)
_TEST = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)")
#: The pages whose claims about Flower, logs and the CLI must name their tests.
CLAIMING = ["operations.md", "celery-tasks.md", "getting-started.md", "metrics.md", "web.md"]
#: What the deploy, compensation and definition pages each say about a changed definition,
#: in the same words (line breaks aside): what ``register()`` and the workers do with it.
CHANGED_DEFINITION = ["deploying.md", "compensation.md", "defining-sagas.md"]
SAME_WORDS = [
    "new runs start on the version registered last",
    "each run finishes on the version it started on",
    "hands the run's messages back",
    "a deploy never fails or unwinds a run",
    "refused at `register()`",
]
#: Sentences that said otherwise: a deploy failed a run, and any changed graph was accepted.
OLD_SENTENCES = [
    "its definition changed in a deploy",
    "different definition hash than the deployed one, the run fails",
    "(a changed definition, see",
    "Registering a different graph under a name that is already registered adds a version",
]


def checked_by(page: Path) -> list[str]:
    """Every ``tests/...::test_...`` a page's ``checked by`` comments name."""
    named = []
    for comment in _CHECKED_BY.findall(page.read_text()):
        parts = [part.strip() for part in comment.split(",") if part.strip()]
        bad = [part for part in parts if not _TEST.fullmatch(part)]
        assert not bad, f"{page.name}: not tests/<file>.py::<test>: {bad}"
        named += parts
    return named


def _words(page: Path) -> str:
    return " ".join(page.read_text().split())


@cache
def _tests_in(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_test_a_page_names_exists() -> None:
    missing = []
    for page in PAGES:
        for name in checked_by(page):
            path, test = name.split("::")
            if not (ROOT / path).is_file() or test not in _tests_in(path):
                missing.append(f"{page.name}: {name}")
    assert missing == []


def test_the_pages_about_flower_logs_and_the_cli_name_their_tests() -> None:
    bare = [name for name in CLAIMING if not checked_by(ROOT / "docs" / name)]
    assert bare == []


def test_the_readme_points_to_the_benchmark_figures_without_copying_them() -> None:
    readme = (ROOT / "README.md").read_text()
    items = [item.split("\n\n")[0] for item in readme.split("\n- ")]
    [line] = [item for item in items if item.startswith("[Benchmarks](benchmarks/README.md)")]
    # a date or a ratio here goes stale at the next measurement
    assert not re.search(r"\d{4}-\d{2}-\d{2}|\d+(\.\d+)?\s*[x\u00d7]", line), line
    assert "Last measured" in line
    assert "### Last measured" in (ROOT / "benchmarks/README.md").read_text()


def test_the_pages_say_the_same_thing_about_a_changed_definition() -> None:
    stale = [
        f"{page.name}: {old!r}" for page in PAGES for old in OLD_SENTENCES if old in _words(page)
    ]
    assert stale == []
    missing = [
        f"{name}: {words!r}"
        for name in CHANGED_DEFINITION
        for words in SAME_WORDS
        if words not in _words(ROOT / "docs" / name)
    ]
    assert missing == []
