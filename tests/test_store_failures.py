"""Guarantees 19 and 20: a store error never hides the step's error, and an unrecorded
reversal parks the unwind."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.runtime.store_retry import keep_cause
from celery_saga.store import forward, unwind
from tests.conftest import Harness


def _failing_first(real: Any, failures: int) -> Any:
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise OperationalError("UPDATE saga_steps", {}, Exception("database is locked"))
        return real(*args, **kwargs)

    return wrapper


def test_store_error_while_recording_a_failure_keeps_the_step_error(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        forward, "record_step_settled", _failing_first(forward.record_step_settled, failures=2)
    )
    execution = sqlite_harness.start("five", {"order": 9, "plan": {"s4": {"fail": True}}}).wait(30)
    assert execution.failure_reason == "ValueError: s4 refused order 9"
    assert execution.rollback_status is RollbackStatus.COMPLETED


def test_when_the_store_keeps_refusing_the_step_error_is_what_propagates(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = sqlite_harness.engine.executor
    monkeypatch.setattr(
        executor, "settings", dataclasses.replace(executor.settings, store_retry_delays=(0.0, 0.0))
    )
    step_error = ValueError("warehouse rejected the reservation")

    def refuse() -> None:
        raise OperationalError("UPDATE saga_steps", {}, Exception("database is locked"))

    with pytest.raises(ValueError, match="warehouse rejected") as raised:
        keep_cause(executor.settings.store_retry_delays, step_error, refuse)
    assert raised.value is step_error
    assert isinstance(raised.value.__cause__, OperationalError)


def test_unrecordable_reversal_outcome_parks_the_unwind(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        unwind, "record_compensation", _failing_first(unwind.record_compensation, failures=1)
    )
    run = sqlite_harness.start("five", {"order": 10, "plan": {"s4": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK
    assert "could not be recorded" in (execution.record.rollback_reason or "")
    assert execution.failure_reason == "ValueError: s4 refused order 10"
    undone = [
        e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "compensate"
    ]
    assert undone == ["s3"], "nothing after the unrecorded reversal may run"
    assert execution.step("s3").compensation_status is None
    sqlite_harness.engine.resume_compensation(run.id)
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = [e for e in sqlite_harness.test_app.entries(run.id) if e.direction == "compensate"]
    # The unrecorded reversal runs again on resume, under the same key, so it can dedupe.
    assert [e.step for e in undone] == ["s3", "s3", "s2", "s1"]
    assert undone[0].key == undone[1].key


def test_a_refused_outcome_write_is_retried_without_running_the_step_again(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        forward, "record_step_completed", _failing_first(forward.record_step_completed, failures=1)
    )
    run = sqlite_harness.start("five", {"order": 11})
    assert run.wait(30).state is ExecutionState.COMPLETED
    forward_entries = [
        e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "forward"
    ]
    assert forward_entries == ["s1", "s2", "s3", "s4", "s5"]
