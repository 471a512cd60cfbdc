"""Guarantees 19, 20 and 26 in one process: a store error never hides the step's error, an
outcome is retried until it is recorded (and never written twice when a reply was lost),
and only an outcome that stays unrecordable past its budget parks the unwind."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.store import forward, history, joins, reversal, unwind
from tests.conftest import Harness


def _refused() -> OperationalError:
    return OperationalError("UPDATE saga_steps", {}, Exception("server closed the connection"))


def _failing_first(real: Any, failures: int, after: bool = False) -> Any:
    """``real`` refused ``failures`` times; with ``after``, it runs and THEN reports a lost
    connection (the write committed, its reply did not arrive)."""
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= failures:
            if after:
                real(*args, **kwargs)
            raise _refused()
        return real(*args, **kwargs)

    return wrapper


@pytest.fixture
def short_budget(sqlite_harness: Harness) -> Iterator[Harness]:
    """An outcome budget of 0.3 s, so a store that keeps refusing gives up quickly."""
    # The runtime's parts are one frozen value that every part of it shares: its settings
    # are swapped in place for the test, and back after it.
    parts = sqlite_harness.engine.executor.parts
    saved = parts.settings
    object.__setattr__(parts, "settings", dataclasses.replace(saved, outcome_retry_budget=0.3))
    yield sqlite_harness
    object.__setattr__(parts, "settings", saved)


def _poll(
    condition: Callable[[], bool], timeout: float = 15, tick: Callable[[], Any] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        tick()
        time.sleep(0.05)


def _undone(harness: Harness, execution_id: str) -> list[Any]:
    return [e for e in harness.test_app.entries(execution_id) if e.direction == "compensate"]


def test_store_error_while_recording_a_failure_keeps_the_step_error(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        joins, "record_step_settled", _failing_first(joins.record_step_settled, failures=2)
    )
    execution = sqlite_harness.start("five", {"order": 9, "plan": {"s4": {"fail": True}}}).wait(30)
    assert execution.failure_reason == "ValueError: s4 refused order 9"
    assert execution.rollback_status is RollbackStatus.COMPLETED


def test_when_the_store_keeps_refusing_the_step_error_is_what_propagates() -> None:
    step_error = ValueError("warehouse rejected the reservation")

    def refuse() -> None:
        raise _refused()

    with pytest.raises(ValueError, match="warehouse rejected") as raised:
        write_outcome(
            refuse, budget=0.2, what="test", landed=lambda: False, if_landed=None, cause=step_error
        )
    assert raised.value is step_error
    assert isinstance(raised.value.__cause__, OperationalError)


def test_a_refused_reversal_outcome_is_retried_and_parks_nothing(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        reversal, "record_compensation", _failing_first(reversal.record_compensation, failures=3)
    )
    run = sqlite_harness.start("five", {"order": 12, "plan": {"s4": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert [e.step for e in _undone(sqlite_harness, run.id)] == ["s3", "s2", "s1"]


def test_a_reversal_outcome_whose_reply_was_lost_is_not_written_or_run_again(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        reversal,
        "record_compensation",
        _failing_first(reversal.record_compensation, failures=1, after=True),
    )
    run = sqlite_harness.start("five", {"order": 13, "plan": {"s4": {"fail": True}}})
    # The lost reply leaves the next move to the timer sweep (beat's, here called by hand).
    _poll(
        lambda: run.get().state is ExecutionState.FAILED,
        tick=sqlite_harness.engine.fire_timers,
    )
    execution = run.get()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert [e.step for e in _undone(sqlite_harness, run.id)] == ["s3", "s2", "s1"]
    assert execution.step("s3").compensation_attempts == 1


def test_an_outcome_unrecordable_past_its_budget_parks_and_resume_names_the_key(
    short_budget: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        reversal,
        "record_compensation",
        _failing_first(reversal.record_compensation, failures=10**6),
    )
    stuck: list[dict[str, Any]] = []
    short_budget.engine.on("saga-compensation-stuck", lambda _e, fields: stuck.append(fields))
    run = short_budget.start("five", {"order": 10, "plan": {"s4": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK
    reason = execution.record.rollback_reason or ""
    assert "could not be recorded" in reason
    assert f"{run.id}:s3:0:compensate" in reason, "the park names the key a resume re-runs"
    assert execution.failure_reason == "ValueError: s4 refused order 10"
    assert [e.step for e in _undone(short_budget, run.id)] == ["s3"], "nothing after it ran"
    assert [f["step"] for f in stuck] == ["s3"]
    monkeypatch.undo()
    short_budget.engine.resume_compensation(run.id)
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = _undone(short_budget, run.id)
    # The unrecorded reversal runs again on resume, under the same key, so it can dedupe.
    assert [e.step for e in undone] == ["s3", "s3", "s2", "s1"]
    assert undone[0].key == undone[1].key


def test_no_stuck_event_for_a_park_that_was_not_stored(
    short_budget: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        reversal,
        "record_compensation",
        _failing_first(reversal.record_compensation, failures=10**6),
    )
    monkeypatch.setattr(unwind, "park_unwind", _failing_first(unwind.park_unwind, failures=10**6))
    stuck: list[dict[str, Any]] = []
    short_budget.engine.on("saga-compensation-stuck", lambda _e, fields: stuck.append(fields))
    run = short_budget.start("five", {"order": 14, "plan": {"s4": {"fail": True}}})
    _poll(lambda: bool(_undone(short_budget, run.id)))
    time.sleep(1.5)  # past the budget of the outcome and of the park
    assert run.get().state is ExecutionState.COMPENSATING
    assert stuck == []


def test_a_refused_outcome_write_is_retried_without_running_the_step_again(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        forward, "record_step_completed", _failing_first(forward.record_step_completed, failures=3)
    )
    run = sqlite_harness.start("five", {"order": 11})
    assert run.wait(30).state is ExecutionState.COMPLETED
    forward_entries = [
        e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "forward"
    ]
    assert forward_entries == ["s1", "s2", "s3", "s4", "s5"]


def test_a_step_result_whose_reply_was_lost_is_not_recorded_or_run_again(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        forward,
        "record_step_completed",
        _failing_first(forward.record_step_completed, failures=1, after=True),
    )
    run = sqlite_harness.start("five", {"order": 15})
    assert run.wait(30).state is ExecutionState.COMPLETED
    forward_entries = [
        e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "forward"
    ]
    assert forward_entries == ["s1", "s2", "s3", "s4", "s5"]
    rows = history.load(sqlite_harness.engine.db, run.id)
    completed = [r.step for r in rows if r.kind == "step-completed"]
    assert completed == forward_entries, "the write that landed wrote its row, once"
