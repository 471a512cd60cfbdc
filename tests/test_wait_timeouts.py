"""Guarantees 14 and 15: wait deadlines are rows that survive restarts, a wait that times out
re-checks for its signal, then fails the run and unwinds it, once even with two sweepers."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import insert

from celery_saga import (
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaEngine,
    get_clock,
    set_clock,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.store.codec import pack
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import signals
from celery_saga.testing import ControlledClock
from tests.conftest import Harness, unconsumed_app


def _past_deadline(harness: Harness, run: Any) -> None:
    wake_at = run.get().record.wake_at
    assert wake_at is not None
    time.sleep(max(0.0, (wake_at - get_clock().now()).total_seconds()) + 0.05)


def test_a_timed_out_wait_fails_the_run_and_unwinds_each_earlier_step_once(
    harness: Harness,
) -> None:
    run = harness.start("approval", {"order": 80})
    assert run.wait(30).state is ExecutionState.WAITING, harness.worker_logs()
    harness.engine.fire_timers()
    assert run.get().state is ExecutionState.WAITING, "its deadline has not passed yet"
    _past_deadline(harness, run)
    assert harness.engine.fire_timers() >= 1
    execution = run.wait(30, states=[ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK])
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert execution.failure_reason is not None
    assert execution.failure_reason.startswith("WaitTimeoutError: saga 'approval' waited 2 s")
    undone = [e for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert [e.step for e in undone] == ["charge", "reserve"]
    harness.engine.fire_timers()
    assert run.get().record.version == execution.record.version, "a fired deadline is gone"


def test_a_signal_before_the_deadline_means_the_sweep_leaves_the_run_alone(
    harness: Harness,
) -> None:
    run = harness.start("approval", {"order": 81})
    assert run.wait(30).state is ExecutionState.WAITING
    harness.engine.signal(run.id, "approved")
    assert run.wait(30).state is ExecutionState.COMPLETED
    time.sleep(2.1)
    harness.engine.fire_timers()
    assert run.get().state is ExecutionState.COMPLETED


# -- direct drive on every store -----------------------------------------------------------


def _approval(engine: SagaEngine, timeout: float | timedelta) -> str:
    name = f"approve{uuid.uuid4().hex[:6]}"
    engine.register(
        Saga(name)
        .step("hold", lambda: "held", compensate=lambda: None)
        .wait_for("approved", timeout=timeout)
        .step("ship", lambda: "shipped")
    )
    return name


def _parked(engine: SagaEngine, saga: str) -> str:
    run = engine.start(saga)
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    engine.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), saga)
    assert engine.get(run.id).state is ExecutionState.WAITING
    return run.id


def test_a_timed_out_wait_rechecks_for_its_signal_before_failing(direct: SagaEngine) -> None:
    saga = _approval(direct, 0.05)
    run_id = _parked(direct, saga)
    # The signal is there although the run still waits (its resume was lost): the sweep
    # must find it and resume, not fail a run that got what it waited for.
    with direct.db.transaction() as connection:
        connection.execute(
            insert(signals).values(
                execution_id=run_id,
                event="approved",
                payload=pack(None),
                received_at=to_db_time(get_clock().now()),
            )
        )
    time.sleep(0.1)
    assert direct.fire_timers() == 1
    execution = direct.get(run_id)
    assert execution.state is ExecutionState.RUNNING
    assert (execution.record.cursor, execution.failure_reason) == (2, None)


def test_waits_of_weeks_are_rows_that_survive_a_restart(store_url: str) -> None:
    clock = ControlledClock(datetime(2031, 3, 1, tzinfo=timezone.utc))
    previous = set_clock(clock)

    def fresh_engine() -> SagaEngine:  # a new process: nothing carried over in memory
        app = unconsumed_app("weeks")
        engine = SagaEngine(app, store_url=store_url)
        engine.register(
            Saga("weeks")
            .step("hold", lambda: "held", compensate=lambda: None)
            .wait_for("approved", timeout=timedelta(weeks=3))
            .step("ship", lambda: "shipped")
        )
        return engine

    try:
        first = fresh_engine()
        first.ensure_schema()
        run_id = _parked(first, "weeks")
        assert first.get(run_id).record.wake_at == clock.now() + timedelta(weeks=3)
        first.db.dispose()
        clock.advance(timedelta(days=20).total_seconds())
        second = fresh_engine()
        assert second.fire_timers() == 0
        assert second.get(run_id).state is ExecutionState.WAITING
        clock.advance(timedelta(days=1).total_seconds())  # exactly on the deadline
        assert second.fire_timers() == 1
        execution = second.get(run_id)
        assert execution.state is ExecutionState.COMPENSATING, "failed, and its unwind begun"
        assert "waited 21 days, 0:00:00" in (execution.failure_reason or "")
        second.db.dispose()
    finally:
        set_clock(previous)


def test_two_sweepers_fire_each_expired_wait_once(store_url: str) -> None:
    def beat_process() -> SagaEngine:
        app = unconsumed_app("beat")
        engine = SagaEngine(app, store_url=store_url)
        engine.ensure_schema()
        return engine

    one, two = beat_process(), beat_process()
    saga = f"sweep{uuid.uuid4().hex[:6]}"
    for engine in (one, two):
        engine.register(
            Saga(saga)
            .step("hold", lambda: "held", compensate=lambda: None)
            .wait_for("approved", timeout=0.05)
        )
    runs = {_parked(one, saga) for _ in range(12)}
    fired: Counter[str] = Counter()
    lock = threading.Lock()

    def count(_event: str, fields: dict[str, Any]) -> None:
        with lock:
            fired[fields["execution_id"]] += 1

    for engine in (one, two):
        engine.on("saga-wait-expired", count)
    time.sleep(0.1)
    barrier = threading.Barrier(2)

    def sweep(engine: SagaEngine) -> None:
        barrier.wait()
        engine.fire_timers()

    threads = [threading.Thread(target=sweep, args=(e,)) for e in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert fired == {run_id: 1 for run_id in runs}
    for run_id in runs:
        assert one.get(run_id).state is ExecutionState.COMPENSATING
    for engine in (one, two):
        engine.db.dispose()


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "soon", True])
def test_a_wait_timeout_must_be_a_positive_number_of_seconds(timeout: Any) -> None:
    from celery_saga import DefinitionError

    with pytest.raises(DefinitionError, match="timeout of wait_for"):
        Saga("bad").wait_for("approved", timeout=timeout)
