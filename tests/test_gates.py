"""Guarantees 14 and 15 for a gate in any position: first, middle, last, alone, inside a
sub-saga. A signal passes the gate wherever it stands, and a final gate's signal completes
the run, whether it arrives while the run waits, before it gets there, or after the deadline
but before the sweep."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import insert, select

from celery_saga import (
    ExecutionNotFoundError,
    ExecutionState,
    InvalidStateError,
    Saga,
    SagaEngine,
    get_clock,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.runtime.children import child_execution_id
from celery_saga.store.codec import pack
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import signals
from tests.conftest import Harness


def _waiting(engine: Any, execution_id: str, timeout: float = 30.0) -> None:
    """Poll until the run (which may not exist yet: a child) waits at a gate."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if engine.get(execution_id).state is ExecutionState.WAITING:
                return
        except ExecutionNotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"execution {execution_id!r} never waited at a gate")


# (saga, child record that holds the gates or None, events in order, steps that run once)
GATES = [
    pytest.param("gate_only", None, ["go"], [], id="alone"),
    pytest.param("two_gates", None, ["first", "second"], ["between", "after"], id="first+middle"),
    pytest.param("gate_last", None, ["go"], ["a"], id="last"),
    pytest.param("gated_parent", "gated_child", ["go"], ["after"], id="middle-of-child"),
    pytest.param("gate_last_parent", "gate_last_child", ["done"], ["p"], id="last-of-last-child"),
]


@pytest.mark.parametrize(("saga", "child", "events", "steps"), GATES)
def test_a_gate_in_any_position_is_passed_by_its_signal(
    harness: Harness, saga: str, child: str | None, events: list[str], steps: list[str]
) -> None:
    run = harness.start(saga, {"order": 90})
    gated = run.id if child is None else child_execution_id(run.id, child)
    for event in events:
        _waiting(harness.engine, gated)
        assert harness.engine.signal(gated, event, event) is True, harness.worker_logs()
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert execution.failure_reason is None
    if child is not None:
        assert harness.engine.get(gated).state is ExecutionState.COMPLETED
    ran = Counter(e.step for e in harness.test_app.entries(run.id) if e.direction == "forward")
    assert ran == Counter(steps), "each step before and after the gates ran exactly once"


def test_a_signal_sent_before_the_run_reaches_its_final_gate_completes_it(
    harness: Harness,
) -> None:
    run = harness.start("gate_last", {"order": 91, "plan": {"a": {"sleep": 1.0}}})
    assert harness.engine.signal(run.id, "go") is False, "kept for the gate not reached yet"
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert execution.record.wake_at is None


# -- a final gate and its deadline, driven directly on every store -------------------------


def _final_gate(engine: SagaEngine, timeout: float) -> tuple[str, str]:
    """A run parked at a final gate with a deadline ``timeout`` seconds away."""
    saga = f"final{uuid.uuid4().hex[:6]}"
    engine.register(
        Saga(saga)
        .step("hold", lambda: "held", compensate=lambda: None)
        .wait_for("go", timeout=timeout)
    )
    run = engine.start(saga)
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    engine.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), saga)
    assert engine.get(run.id).state is ExecutionState.WAITING
    return saga, run.id


def _signal_rows(engine: SagaEngine, execution_id: str) -> int:
    with engine.db.transaction() as connection:
        query = select(signals.c.event).where(signals.c.execution_id == execution_id)
        return len(connection.execute(query).all())


def test_a_signal_after_the_deadline_but_before_the_sweep_completes_the_run(
    direct: SagaEngine,
) -> None:
    _, run_id = _final_gate(direct, 0.05)
    time.sleep(0.1)
    assert direct.signal(run_id, "go") is True
    assert direct.get(run_id).state is ExecutionState.COMPLETED
    assert direct.fire_timers() == 0, "nothing left to fire"
    execution = direct.get(run_id)
    assert (execution.state, execution.failure_reason) == (ExecutionState.COMPLETED, None)


def test_the_sweep_completes_a_final_gate_whose_signal_is_there(direct: SagaEngine) -> None:
    _, run_id = _final_gate(direct, 0.05)
    # The signal is stored but its resume was lost: the sweep re-checks and resumes, which
    # past a final gate means completing the run rather than failing it.
    with direct.db.transaction() as connection:
        connection.execute(
            insert(signals).values(
                execution_id=run_id,
                event="go",
                payload=pack(None),
                received_at=to_db_time(get_clock().now()),
            )
        )
    time.sleep(0.1)
    assert direct.fire_timers() == 1
    execution = direct.get(run_id)
    assert (execution.state, execution.failure_reason) == (ExecutionState.COMPLETED, None)
    assert execution.record.wake_at is None


def test_a_signal_after_a_final_gate_timed_out_is_refused_and_stores_nothing(
    direct: SagaEngine,
) -> None:
    _, run_id = _final_gate(direct, 0.05)
    time.sleep(0.1)
    assert direct.fire_timers() == 1
    timed_out = direct.get(run_id)
    assert timed_out.state is ExecutionState.COMPENSATING
    with pytest.raises(InvalidStateError, match="the run is compensating"):
        direct.signal(run_id, "go")
    assert _signal_rows(direct, run_id) == 0
    assert direct.get(run_id).record.version == timed_out.record.version
