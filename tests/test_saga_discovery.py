"""``engine.autodiscover_sagas()`` finds sagas the way Celery finds tasks: a worker imports
each package's ``sagas`` module as it starts, any other process on its first lookup of a
saga it does not know; an unknown name says where it was looked for."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import Saga, SagaEngine, SagaError, UnknownSagaError
from tests.conftest import unconsumed_app

#: The engine the generated ``sagas`` modules register on.
ENGINE: Any = None

_SAGAS_MODULE = """
from celery_saga import Saga
from tests.test_saga_discovery import ENGINE

ENGINE.register(Saga({name!r}).step("only", lambda: None))
"""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SagaEngine]:
    global ENGINE
    monkeypatch.syspath_prepend(str(tmp_path))
    ENGINE = SagaEngine(unconsumed_app("discovery"), store_url=f"sqlite:///{tmp_path}/d.sqlite3")
    yield ENGINE
    ENGINE.db.dispose()
    ENGINE = None


def _package(root: Path, sagas: str | None = None, module: str = "sagas") -> str:
    """A new package under ``root`` (unique name: modules stay imported), with a module
    ``module`` registering saga ``sagas`` when given; the package's name."""
    name = f"shop_{uuid.uuid4().hex[:8]}"
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    if sagas is not None:
        (root / name / f"{module}.py").write_text(_SAGAS_MODULE.format(name=sagas))
    return name


def test_a_lookup_of_an_unknown_saga_imports_the_sagas_modules_first(
    engine: SagaEngine, tmp_path: Path
) -> None:
    package = _package(tmp_path, "found")
    engine.autodiscover_sagas([package, _package(tmp_path)])
    assert f"{package}.sagas" not in sys.modules, "discovery is lazy"
    run = engine.start("found")
    assert engine.get(run.id).record.saga_name == "found"
    assert f"{package}.sagas" in sys.modules


def test_a_worker_imports_the_sagas_modules_when_it_imports_its_task_modules(
    engine: SagaEngine, tmp_path: Path
) -> None:
    package = _package(tmp_path, "at-start")
    engine.autodiscover_sagas(lambda: [package])
    engine.app.loader.import_default_modules()  # what a worker and beat do as they start
    assert engine.catalog.known("at-start") is not None


def test_sagas_registered_in_a_module_the_celery_app_imports_are_found_too(
    engine: SagaEngine, tmp_path: Path
) -> None:
    package = _package(tmp_path, "in-tasks", module="tasks")
    engine.app.autodiscover_tasks([package])
    assert engine.definition("in-tasks").name == "in-tasks"


def test_an_unknown_name_says_where_sagas_were_looked_for(
    engine: SagaEngine, tmp_path: Path
) -> None:
    with pytest.raises(UnknownSagaError) as bare:
        engine.start("order")
    assert "(known: none)" in str(bare.value)
    assert "looked for only in the Celery app's task modules" in str(bare.value)
    assert "engine.autodiscover_sagas()" in str(bare.value)
    package = _package(tmp_path, "other")
    engine.autodiscover_sagas([package])
    with pytest.raises(UnknownSagaError) as searched:
        engine.start("order")
    message = str(searched.value)
    assert "(known: other)" in message and "<app>.sagas" in message, message
    assert f"imported: {package}.sagas" in message, message


def test_a_broken_sagas_module_is_raised_not_skipped(engine: SagaEngine, tmp_path: Path) -> None:
    package = _package(tmp_path)
    (tmp_path / package / "sagas.py").write_text("import not_a_module_anywhere\n")
    engine.autodiscover_sagas([package])
    with pytest.raises(ModuleNotFoundError, match="not_a_module_anywhere"):
        engine.start("order")


def test_a_package_that_cannot_be_imported_is_refused_and_not_recorded(
    engine: SagaEngine,
) -> None:
    with pytest.raises(SagaError, match="package 'no_such_package' cannot be imported"):
        engine.autodiscover_sagas(["no_such_package"], force=True)
    assert engine.discovery.where().startswith("looked for only"), "nothing was recorded"


def test_a_related_name_that_is_not_a_module_name_is_refused(engine: SagaEngine) -> None:
    with pytest.raises(SagaError, match=r"related_name=\.\.\.\) must be a module name"):
        engine.autodiscover_sagas(related_name="orders.sagas")
    assert engine.discovery.where().startswith("looked for only"), "nothing was recorded"


#: A module-level lambda, as the generated module's step: the same version.
_AS_IN_THE_MODULE = [lambda: None]


def test_check_versions_looks_for_the_sagas_before_calling_a_run_stranded(
    engine: SagaEngine, tmp_path: Path
) -> None:
    package = _package(tmp_path, "checked")
    engine.autodiscover_sagas([package])
    other = SagaEngine(unconsumed_app("other"), store_url=f"sqlite:///{tmp_path}/d.sqlite3")
    other.register(Saga("checked").step("only", _AS_IN_THE_MODULE[0]))
    other.start("checked")
    assert engine.check_versions().ok, "the version is in a sagas module not imported yet"
    other.db.dispose()
