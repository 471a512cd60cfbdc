"""Issue 42: a step with ``on_failure="hold"`` holds its run for an operator, who retries
it, skips it, unwinds it or cancels it; each move first-writer-wins, refused with nothing
stored on a run that is not held."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from celery_saga import CompensationOutcome, ExecutionState, InvalidStateError, RollbackStatus
from celery_saga.errors import SchemaValidationError
from celery_saga.records import StepStatus
from celery_saga.store import history
from tests.conftest import Harness


def _history(harness: Harness, run_id: str) -> list[Any]:
    return history.load(harness.engine.db, run_id)


def _down(harness: Harness) -> str:
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    return switch


def _wait_state(harness: Harness, run_id: str, state: ExecutionState, within: float = 30) -> Any:
    ends = time.monotonic() + within
    while time.monotonic() < ends:
        execution = harness.engine.get(run_id)
        if execution.state is state:
            return execution
        time.sleep(0.05)
    raise AssertionError(
        f"{run_id} is {harness.engine.get(run_id).state}, not {state}\n{harness.worker_logs()}"
    )


def _held(harness: Harness, saga: str = "held_order", order: int = 1) -> tuple[Any, str]:
    switch = _down(harness)
    run = harness.start(saga, {"order": order, "down": switch})
    return _wait_state(harness, run.id, ExecutionState.HELD), switch


def _rows(harness: Harness, run_id: str, direction: str, step: str = "charge") -> list[Any]:
    entries = harness.test_app.entries(run_id)
    return [e for e in entries if e.direction == direction and e.step == step]


def test_a_hold_step_that_exhausts_its_retries_holds_the_run_and_reverses_nothing(
    harness: Harness,
) -> None:
    execution, _ = _held(harness)
    assert execution.failure_reason.startswith("ConnectionError: payment provider down")
    charge = execution.step("charge")
    assert charge.status is StepStatus.FAILED
    assert charge.attempts == 2
    assert execution.rollback_status is None
    assert execution.step("reserve").compensation_status is None
    assert not [e for e in harness.test_app.entries(execution.id) if e.direction == "compensate"]
    kinds = [row.kind for row in _history(harness, execution.id)]
    assert kinds[-1] == "held"


def test_retry_runs_the_step_again_with_a_fresh_budget_and_the_same_key(harness: Harness) -> None:
    execution, switch = _held(harness)
    key = execution.step("charge").idempotency_key
    harness.test_app.set_switch(switch, False)
    harness.engine.retry(execution.id, actor="ops@example", reason="provider is back")
    done = _wait_state(harness, execution.id, ExecutionState.COMPLETED)
    assert [e.key for e in _rows(harness, done.id, "effect")] == [key], "charged exactly once"
    assert len(_rows(harness, done.id, "forward")) == 3, "2 held attempts, then 1 that passed"
    assert done.step("charge").idempotency_key == key
    rows = [r for r in _history(harness, done.id) if r.kind == "hold-retried"]
    assert [(r.actor, r.detail) for r in rows] == [("ops@example", "provider is back")]


def test_a_retry_that_fails_again_holds_again_after_a_fresh_set_of_attempts(
    harness: Harness,
) -> None:
    execution, _ = _held(harness)
    harness.engine.retry(execution.id)
    _wait_state(harness, execution.id, ExecutionState.RUNNING, within=5)
    again = _wait_state(harness, execution.id, ExecutionState.HELD)
    assert again.step("charge").attempts == 2
    assert len(_rows(harness, again.id, "forward")) == 4


def test_skip_records_the_result_by_hand_and_a_later_unwind_still_reverses_it(
    harness: Harness,
) -> None:
    switch = _down(harness)
    run = harness.start(
        "held_order", {"order": 2, "down": switch, "plan": {"ship": {"fail": True}}}
    )
    execution = _wait_state(harness, run.id, ExecutionState.HELD)
    harness.engine.skip(execution.id, result={"charged": 2, "by": "hand"}, actor="ops")
    ended = _wait_state(harness, run.id, ExecutionState.FAILED)
    assert ended.step("charge").status is StepStatus.COMPLETED
    assert ended.step("charge").result == {"charged": 2, "by": "hand"}
    assert ended.rollback_status is RollbackStatus.COMPLETED
    # its failed attempts may have had effects (guarantee 6): its reversal runs
    assert ended.step("charge").compensation_status is CompensationOutcome.COMPENSATED
    undone = [e.step for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert undone == ["ship", "charge", "reserve"]


def test_skip_checks_the_result_against_the_output_schema_naming_the_field(
    harness: Harness,
) -> None:
    execution, _ = _held(harness, "held_schema")
    with pytest.raises(SchemaValidationError, match="'charged'"):
        harness.engine.skip(execution.id, result={"charged": "lots"})
    after = harness.engine.get(execution.id)
    assert after.state is ExecutionState.HELD
    assert after.record.version == execution.record.version, "nothing stored"
    harness.engine.skip(execution.id, result={"charged": 5})
    done = _wait_state(harness, execution.id, ExecutionState.COMPLETED)
    assert done.step("charge").result == {"charged": 5}


def test_unwind_begins_the_unwind_as_an_exhausted_unwind_step_would(harness: Harness) -> None:
    execution, _ = _held(harness)
    harness.engine.unwind(execution.id, actor="ops", reason="customer gave up")
    ended = _wait_state(harness, execution.id, ExecutionState.FAILED)
    assert ended.rollback_status is RollbackStatus.COMPLETED
    assert ended.failure_reason.startswith("ConnectionError: payment provider down")
    undone = [e.step for e in harness.test_app.entries(ended.id) if e.direction == "compensate"]
    assert undone == ["charge", "reserve"]


def test_unwind_past_the_pivot_is_refused_naming_it_and_stores_nothing(harness: Harness) -> None:
    execution, switch = _held(harness, "held_pivoted")
    with pytest.raises(InvalidStateError, match="pivot after step 'reserve'"):
        harness.engine.unwind(execution.id)
    assert harness.engine.get(execution.id).record.version == execution.record.version
    harness.test_app.set_switch(switch, False)
    harness.engine.retry(execution.id)
    assert _wait_state(harness, execution.id, ExecutionState.COMPLETED)


def test_a_cancel_applies_to_a_held_run(harness: Harness) -> None:
    execution, _ = _held(harness)
    harness.engine.cancel(execution.id, "order withdrawn", actor="ops")
    ended = _wait_state(harness, execution.id, ExecutionState.CANCELLED)
    undone = [e.step for e in harness.test_app.entries(ended.id) if e.direction == "compensate"]
    assert undone == ["charge", "reserve"]


def test_moves_on_a_run_that_is_not_held_are_refused_naming_its_state(harness: Harness) -> None:
    run = harness.start("held_order", {"order": 3})
    done = _wait_state(harness, run.id, ExecutionState.COMPLETED)
    rows = len(_history(harness, run.id))
    moves = (
        lambda: harness.engine.retry(run.id),
        lambda: harness.engine.skip(run.id, result={}),
        lambda: harness.engine.unwind(run.id),
    )
    for move in moves:
        with pytest.raises(InvalidStateError, match="to be held; it is completed"):
            move()
    after = harness.engine.get(run.id)
    assert after.record.version == done.record.version
    assert len(_history(harness, run.id)) == rows, "no history row either"


def test_the_hold_timeout_unwinds_a_run_nobody_moved(harness: Harness) -> None:
    execution, _ = _held(harness, "held_briefly")
    assert execution.record.wake_at is not None
    harness.engine.fire_timers()  # not due yet: nothing to fire
    assert harness.engine.get(execution.id).state is ExecutionState.HELD
    time.sleep(1.6)
    assert harness.engine.fire_timers() >= 1
    ended = _wait_state(harness, execution.id, ExecutionState.FAILED)
    assert ended.rollback_status is RollbackStatus.COMPLETED
    rows = [r for r in _history(harness, ended.id) if r.kind == "hold-unwound"]
    assert [r.actor for r in rows] == ["hold timeout"]


def test_a_saga_deadline_cancels_a_held_run(harness: Harness) -> None:
    execution, _ = _held(harness, "held_deadline")
    time.sleep(max(0.0, 3.1 - (time.time() - execution.record.created_at.timestamp())))
    harness.engine.fire_timers()
    ended = _wait_state(harness, execution.id, ExecutionState.CANCELLED)
    assert ended.step("reserve").compensation_status is CompensationOutcome.COMPENSATED


def test_two_operators_retrying_ten_held_runs_at_once_charge_each_once(harness: Harness) -> None:
    """The real-worker side of tests/test_hold_races.py: the moves race in two threads, the
    step runs in worker processes."""
    switch = _down(harness)
    runs = [harness.start("held_order", {"order": n, "down": switch}) for n in range(10)]
    for run in runs:
        _wait_state(harness, run.id, ExecutionState.HELD)
    harness.test_app.set_switch(switch, False)
    refused: list[str] = []

    def operator() -> None:
        for run in runs:
            try:
                harness.engine.retry(run.id, actor=threading.current_thread().name)
            except InvalidStateError:
                refused.append(run.id)

    threads = [threading.Thread(target=operator, name=f"ops{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == len(runs), "one retry per run landed, the other was refused"
    for run in runs:
        done = _wait_state(harness, run.id, ExecutionState.COMPLETED)
        assert len(_rows(harness, done.id, "effect")) == 1
        assert [r.kind for r in _history(harness, done.id)].count("hold-retried") == 1


def test_a_hold_is_announced_and_its_task_ends_as_a_failure_in_celery(harness: Harness) -> None:
    """Events for monitors, and the held attempt's task FAILURE as Celery (and Flower) show
    a failed task, with the hold logged at WARNING by the engine."""
    if not harness.in_process:
        pytest.skip("listens to the in-process worker's events")
    seen: list[tuple[str, dict[str, Any]]] = []

    def listen(event: str, fields: dict[str, Any]) -> None:
        if event == "saga-held" or event.startswith("saga-hold-"):
            seen.append((event, fields))

    harness.engine.on("*", listen)
    execution, switch = _held(harness)
    harness.test_app.set_switch(switch, False)
    harness.engine.retry(execution.id, actor="ops")
    _wait_state(harness, execution.id, ExecutionState.COMPLETED)
    mine = [(e, f) for e, f in seen if f.get("execution_id") == execution.id]
    assert [e for e, _ in mine] == ["saga-held", "saga-hold-retried"]
    assert mine[0][1]["step"] == "charge" and mine[0][1]["attempts"] == 2
    holder = [r for r in _history(harness, execution.id) if r.kind == "step-failed"][-1].holder
    task_id = holder.rsplit("/", 1)[-1]
    assert harness.test_app.app.AsyncResult(task_id).state == "FAILURE"


def test_an_outage_holds_the_runs_it_meets_and_a_bulk_retry_completes_every_one(
    harness: Harness,
) -> None:
    """The outage scenario, small (benchmarks/hold_outage.py runs 500 with a 60 s outage):
    runs started before, during and after the provider is down; the held ones retried in
    a loop over ``engine.list(state="held")``: none unwound, every charge once."""
    switch = f"down-{uuid.uuid4().hex}"
    runs = [harness.start("held_order", {"order": n, "down": switch}) for n in range(5)]
    for run in runs:
        _wait_state(harness, run.id, ExecutionState.COMPLETED)
    harness.test_app.set_switch(switch, True)
    runs += [harness.start("held_order", {"order": n, "down": switch}) for n in range(5, 25)]
    held = [_wait_state(harness, run.id, ExecutionState.HELD).id for run in runs[-20:]]
    harness.test_app.set_switch(switch, False)
    runs += [harness.start("held_order", {"order": n, "down": switch}) for n in range(25, 30)]
    listed = harness.engine.list(saga="held_order", state="held", limit=1000).items
    to_retry = [record.id for record in listed if record.id in {r.id for r in runs}]
    assert sorted(to_retry) == sorted(held)
    for execution_id in to_retry:
        harness.engine.retry(execution_id, actor="ops", reason="provider back")
    for run in runs:
        done = _wait_state(harness, run.id, ExecutionState.COMPLETED)
        assert len(_rows(harness, done.id, "effect")) == 1
        assert not [e for e in harness.test_app.entries(done.id) if e.direction == "compensate"]


def test_a_hold_step_that_runs_past_its_timeout_holds_the_run(harness: Harness) -> None:
    run = harness.start("held_slow", {"order": 31, "plan": {"slow": {"sleep": 3}}})
    execution = _wait_state(harness, run.id, ExecutionState.HELD)
    assert "StepTimeoutError" in execution.failure_reason or "TimeLimit" in (
        execution.failure_reason
    ), execution.failure_reason
    assert execution.step("reserve").compensation_status is None
