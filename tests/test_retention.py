"""Guarantee 23: cleanup and archive touch terminal runs only (cutoff inclusive), take child
runs with their parent, never remove a parked or waiting run, and split the work safely
between two beat processes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from celery_saga import ExecutionState, RollbackStatus, SagaEngine, SagaError, set_clock
from celery_saga.store import queries
from celery_saga.store.codec import pack
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import (
    decisions,
    decisions_archive,
    executions,
    executions_archive,
    signals,
    signals_archive,
    step_records,
    step_records_archive,
)
from celery_saga.testing import ControlledClock
from tests.conftest import unconsumed_app

T0 = datetime(2032, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> Iterator[ControlledClock]:
    controlled = ControlledClock(T0)
    previous = set_clock(controlled)
    yield controlled
    set_clock(previous)


def _engine(store_url: str) -> SagaEngine:
    app = unconsumed_app("retain")
    engine = SagaEngine(app, store_url=store_url)
    engine.ensure_schema()
    return engine


def _seed(
    engine: SagaEngine,
    state: ExecutionState,
    at: datetime,
    rollback: RollbackStatus | None = None,
    parent: str | None = None,
) -> str:
    """A run in ``state``, last updated ``at``, with a step, a signal and a decision."""
    run_id = f"keep-{uuid.uuid4().hex[:12]}"
    queries.create_execution(
        engine.db,
        execution_id=run_id,
        saga_name="old",
        definition_hash="h",
        input_blob=pack({"n": 1}),
        node=0,
        sub=0,
        state=state,
        committed=False,
        now=at,
        parent_execution_id=parent,
    )
    stamp = to_db_time(at)
    with engine.db.transaction() as connection:
        connection.execute(
            executions.update()
            .where(executions.c.id == run_id)
            .values(rollback_status=rollback.value if rollback else None)
        )
        connection.execute(
            insert(step_records).values(
                execution_id=run_id,
                name="a",
                node=0,
                sub=0,
                status="completed",
                attempts=1,
                idempotency_key=f"{run_id}:a:0:forward",
                compensatable=False,
                started_at=stamp,
                compensation_attempts=0,
            )
        )
        connection.execute(
            insert(signals).values(execution_id=run_id, event="go", received_at=stamp)
        )
        connection.execute(
            insert(decisions).values(execution_id=run_id, key="branch:0", created_at=stamp)
        )
    return run_id


def _count(engine: SagaEngine, table: Any, ids: set[str]) -> int:
    key = table.c.id if table.name.startswith("saga_executions") else table.c.execution_id
    with engine.db.transaction() as connection:
        query = select(func.count()).select_from(table).where(key.in_(ids))
        return int(connection.execute(query).scalar_one())


def test_cleanup_removes_old_terminal_runs_cutoff_inclusive_and_nothing_else(
    store_url: str, clock: ControlledClock
) -> None:
    engine = _engine(store_url)
    gone = {
        _seed(engine, ExecutionState.COMPLETED, T0),
        _seed(engine, ExecutionState.FAILED, T0, RollbackStatus.COMPLETED),
        _seed(engine, ExecutionState.FAILED, T0, RollbackStatus.STUCK),
    }
    kept = {
        _seed(engine, ExecutionState.COMPLETED, T0 + timedelta(microseconds=1)),
        _seed(engine, ExecutionState.COMPENSATION_STUCK, T0, RollbackStatus.STUCK),
        _seed(engine, ExecutionState.WAITING, T0),
        _seed(engine, ExecutionState.RUNNING, T0),
        _seed(engine, ExecutionState.COMPENSATING, T0),
        _seed(engine, ExecutionState.FAILED, T0),  # its unwind never started: owed
    }
    clock.advance(3600)
    # Other tests' runs share the server databases: count only what this test seeded.
    assert engine.cleanup(timedelta(hours=1)) >= 3
    for table in (executions, step_records, signals, decisions):
        assert _count(engine, table, gone) == 0, table.name
        assert _count(engine, table, kept) == len(kept), table.name
    engine.db.dispose()


def test_children_go_with_their_parent_and_a_parked_child_keeps_its_family(
    store_url: str, clock: ControlledClock
) -> None:
    engine = _engine(store_url)
    parent = _seed(engine, ExecutionState.COMPLETED, T0)
    child = _seed(engine, ExecutionState.COMPLETED, T0 + timedelta(days=9), parent=parent)
    grandchild = _seed(engine, ExecutionState.COMPLETED, T0, parent=child)
    held = _seed(engine, ExecutionState.FAILED, T0, RollbackStatus.STUCK)
    parked = _seed(engine, ExecutionState.COMPENSATION_STUCK, T0, parent=held)
    orphan = _seed(engine, ExecutionState.COMPLETED, T0, parent=f"gone-{uuid.uuid4().hex}")
    clock.advance(60)
    assert engine.cleanup(0) >= 4
    assert _count(engine, executions, {parent, child, grandchild, orphan}) == 0
    assert _count(engine, executions, {held, parked}) == 2
    engine.db.dispose()


def test_archive_moves_every_row_of_a_run_into_the_archive_tables(
    store_url: str, clock: ControlledClock
) -> None:
    engine = _engine(store_url)
    parent = _seed(engine, ExecutionState.COMPLETED, T0)
    child = _seed(engine, ExecutionState.FAILED, T0, RollbackStatus.COMPLETED, parent=parent)
    young = _seed(engine, ExecutionState.COMPLETED, T0 + timedelta(seconds=30))
    clock.advance(60)
    assert engine.archive(45) >= 2
    family = {parent, child}
    for live, archive in (
        (executions, executions_archive),
        (step_records, step_records_archive),
        (signals, signals_archive),
        (decisions, decisions_archive),
    ):
        assert _count(engine, live, family) == 0, live.name
        assert _count(engine, archive, family) == 2, archive.name
    assert _count(engine, executions, {young}) == 1
    with engine.db.transaction() as connection:
        row = connection.execute(
            select(executions_archive).where(executions_archive.c.id == child)
        ).one()
    assert (row.state, row.parent_execution_id, row.rollback_status) == (
        "failed",
        parent,
        "completed",
    )
    assert row.archived_at == to_db_time(T0 + timedelta(seconds=60))
    engine.db.dispose()


def test_two_archivers_at_once_archive_each_run_once(
    store_url: str, clock: ControlledClock
) -> None:
    one, two = _engine(store_url), _engine(store_url)
    runs = {_seed(one, ExecutionState.COMPLETED, T0) for _ in range(40)}
    clock.advance(10)
    barrier, counts, errors = threading.Barrier(2), [], []

    def archiver(engine: SagaEngine) -> None:
        barrier.wait()
        try:
            counts.append(engine.archive(0))
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=archiver, args=(e,)) for e in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert _count(one, executions_archive, runs) == len(runs)
    assert _count(one, executions, runs) == 0
    assert sum(counts) >= len(runs)  # other tests' old runs may be archived too
    for engine in (one, two):
        engine.db.dispose()


@pytest.mark.parametrize("older_than", [-1, float("nan"), "1 day", True])
def test_a_bad_retention_is_refused_and_removes_nothing(
    store_url: str, clock: ControlledClock, older_than: Any
) -> None:
    engine = _engine(store_url)
    run = _seed(engine, ExecutionState.COMPLETED, T0)
    clock.advance(10)
    with pytest.raises(SagaError, match=r"must be a number of seconds >= 0"):
        engine.cleanup(older_than)
    with pytest.raises(SagaError, match=r"archive\(older_than\)"):
        engine.archive(older_than)
    assert _count(engine, executions, {run}) == 1
    engine.db.dispose()


def test_archiving_an_id_archived_before_replaces_the_older_copy(
    store_url: str, clock: ControlledClock
) -> None:
    engine = _engine(store_url)
    run_id = f"again-{uuid.uuid4().hex[:12]}"
    for saga_name in ("first", "second"):
        queries.create_execution(
            engine.db,
            execution_id=run_id,
            saga_name=saga_name,
            definition_hash="h",
            input_blob=pack({}),
            node=0,
            sub=0,
            state=ExecutionState.COMPLETED,
            committed=False,
            now=clock.now(),
        )
        clock.advance(10)
        assert engine.archive(0) >= 1
    with engine.db.transaction() as connection:
        names = connection.execute(
            select(executions_archive.c.saga_name).where(executions_archive.c.id == run_id)
        ).all()
    assert [row.saga_name for row in names] == ["second"]
    engine.db.dispose()


def test_the_beat_task_works_a_backlog_through_in_bounded_runs_cancelled_runs_included(
    tmp_path: Any, clock: ControlledClock
) -> None:
    """The beat task stops after the batch that passes half its interval; the next run goes
    on. A cancelled run is terminal: it is retired like a completed one."""
    from celery_saga.worker.publisher import CLEANUP_TASK

    engine = _engine(f"sqlite:///{tmp_path}/retire.sqlite3")
    engine.app.conf.update(saga_cleanup_after=60, saga_cleanup_interval=0)
    old = clock.now() - timedelta(days=1)
    ids = {_seed(engine, ExecutionState.COMPLETED, old) for _ in range(500)}
    ids.add(_seed(engine, ExecutionState.CANCELLED, old, RollbackStatus.COMPLETED))
    task = engine.app.tasks[CLEANUP_TASK]
    runs = [task.apply().get()]
    assert runs == [500], "one batch, then its budget (0 s) was spent"
    while _count(engine, executions, ids) and len(runs) < 10:
        runs.append(task.apply().get())  # each run goes on where the last one stopped
    assert sum(runs) == 501 and _count(engine, executions, ids) == 0, runs
