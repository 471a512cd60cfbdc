"""Guarantee 22 once a version is retired from the code: every version's shape (what its
structural hash covers) is stored with it, so a process with only the newest version moves
a parked run of an older one when the nodes it reached are unchanged, and refuses, naming
the node and storing nothing, when one differs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, select, update

from celery_saga import ExecutionState, SagaEngine, UpgradeRefusedError
from celery_saga.cli import saga as saga_cli
from celery_saga.definition.hashing import shape_text
from celery_saga.definition.shapes import read_shape, shape_of
from celery_saga.store import history
from celery_saga.store.tables import version_shapes
from celery_saga.worker.embedded import embedded_worker
from tests.version_runs import (
    V1,
    approve,
    engine_with,
    give_back_v2,
    hold_v2,
    notify,
    park_v1_runs,
    refund,
    settle,
)


@pytest.fixture
def new_only(own_store: str) -> Iterator[tuple[SagaEngine, dict[str, str]]]:
    """A store with parked runs of version 1, and a process with only version 2 (which
    adds a step after the wait: every node a parked run reached is unchanged)."""
    runs = park_v1_runs(own_store)
    new = engine_with(own_store, approve("2").step("notify", notify), refund("2"))
    yield new, runs
    new.db.dispose()


def _ctx(engine: SagaEngine) -> Any:
    return type("Ctx", (), {"app": engine.app})()


def test_a_process_with_only_v2_moves_a_parked_v1_run_whose_reached_nodes_are_unchanged(
    new_only: tuple[SagaEngine, dict[str, str]],
) -> None:
    new, runs = new_only
    waiting = runs["waiting"]
    assert new.catalog.versions("approve") == [new.definition("approve")], "v2 only"
    moved = CliRunner().invoke(saga_cli, ["upgrade", waiting], obj=_ctx(new))
    assert moved.exit_code == 0, moved.output
    assert new.get(waiting).record.definition_hash == new.definition("approve").hash
    (row,) = [r for r in history.load(new.db, waiting) if r.kind == "upgraded"]
    assert row.detail is not None and new.definition("approve").hash in row.detail
    with embedded_worker(new.app, concurrency=1):
        new.signal(waiting, "ok")
        settle(new, waiting, ExecutionState.COMPLETED)
    assert [s.name for s in new.get(waiting).steps] == ["hold", "done", "notify"]


def test_a_process_with_only_v2_refuses_a_run_whose_reached_node_differs_storing_nothing(
    own_store: str,
) -> None:
    runs = park_v1_runs(own_store)
    new = engine_with(own_store, approve("2", hold_v2), refund("2", give_back_v2))
    for execution_id, node in ((runs["waiting"], "hold"), (runs["stuck"], "take")):
        before = new.get(execution_id)
        rows = history.load(new.db, execution_id)
        with pytest.raises(UpgradeRefusedError, match=f"node '{node}' differs") as refused:
            new.upgrade(execution_id)
        assert "nothing was changed" in str(refused.value)
        assert new.get(execution_id) == before, "nothing stored on refusal"
        assert history.load(new.db, execution_id) == rows
    refused_cli = CliRunner().invoke(saga_cli, ["upgrade", runs["stuck"]], obj=_ctx(new))
    assert refused_cli.exit_code == 1
    assert "its compensation 'give_back' is 'give_back_v2' there" in refused_cli.output
    new.db.dispose()


def test_a_run_whose_versions_shape_was_never_stored_is_refused_naming_why(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/old.sqlite3"
    runs = park_v1_runs(store)
    new = engine_with(store, approve("2").step("notify", notify), refund("2"))
    with new.db.transaction() as connection:  # as a run stored before shapes were kept
        connection.execute(version_shapes.delete())
    before = new.get(runs["waiting"])
    with pytest.raises(UpgradeRefusedError, match="whose shape is not in the store"):
        new.upgrade(runs["waiting"])
    assert new.get(runs["waiting"]) == before
    new.db.dispose()


def test_a_stored_shape_that_does_not_hash_to_its_version_is_not_used(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/forged.sqlite3"
    runs = park_v1_runs(store)
    new = engine_with(store, approve("2", hold_v2), refund("2"))
    v1 = approve("1").seal()
    forged = shape_text(v1.name, approve("2", hold_v2).seal().nodes, v1.label)
    with new.db.transaction() as connection:
        connection.execute(
            update(version_shapes)
            .where(version_shapes.c.definition_hash == v1.hash)
            .values(shape=forged)
        )
    with pytest.raises(UpgradeRefusedError, match="does not hash to that version"):
        new.upgrade(runs["waiting"])
    assert new.get(runs["waiting"]).record.definition_hash == v1.hash
    new.db.dispose()


def test_starting_a_run_stores_its_versions_shape_once_per_process(own_store: str) -> None:
    engine = engine_with(own_store, approve("1"))
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if "saga_version_shapes" in sql:
            sent.append(sql)

    event.listen(engine.db.engine, "before_cursor_execute", record)
    try:
        engine.start("approve", {})
        first = len(sent)
        engine.start("approve", {})
        engine.start("approve", {})
    finally:
        event.remove(engine.db.engine, "before_cursor_execute", record)
    assert first == 2, sent  # one read, one insert
    assert len(sent) == first, "the next runs of the version cost nothing more"
    with engine.db.engine.connect() as connection:
        (row,) = connection.execute(select(version_shapes)).mappings().all()
    definition = engine.definition("approve")
    assert read_shape("approve", definition.hash, row["shape"]) == shape_of(definition)
    assert row["label"] == "1"
    again = engine_with(own_store, approve("1"))
    again.start("approve", {})
    with again.db.engine.connect() as connection:
        assert len(connection.execute(select(version_shapes)).all()) == 1, "once per version"
    engine.db.dispose()
    again.db.dispose()


def test_a_starting_worker_stores_the_shape_of_every_version_it_registered(
    tmp_path: Path,
) -> None:
    engine = engine_with(f"sqlite:///{tmp_path}/worker.sqlite3", *V1, approve("2"))
    engine.versioning.announce()
    with engine.db.engine.connect() as connection:
        stored = {r.definition_hash for r in connection.execute(select(version_shapes))}
    assert stored == {d.hash for n in ("approve", "refund") for d in engine.catalog.versions(n)}
    engine.db.dispose()
