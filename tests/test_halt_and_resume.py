"""Guarantees 2, 3, 7: halt on a definitive reversal failure, resume, abandon, default timeout."""

from __future__ import annotations

import uuid

import pytest

from celery_saga import (
    CompensationOutcome,
    ExecutionState,
    InvalidStateError,
    RollbackStatus,
)
from tests.conftest import Harness


def _stuck_run(harness: Harness) -> tuple[object, str]:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": 7, "plan": plan})
    return run, switch


def test_definitive_reversal_failure_parks_the_run_and_leaves_unreached_steps_open(
    harness: Harness,
) -> None:
    run, _ = _stuck_run(harness)
    execution = run.wait(30)  # type: ignore[attr-defined]
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.STUCK
    assert execution.failure_reason == "ValueError: s4 refused order 7"
    assert "ConnectionError: cannot undo s2" in (execution.record.rollback_reason or "")
    outcomes = {r.name: r.compensation_status for r in execution.steps}
    assert outcomes["s3"] is CompensationOutcome.COMPENSATED
    assert outcomes["s2"] is CompensationOutcome.FAILED
    assert outcomes["s1"] is None, "a step the unwind never reached keeps no outcome"
    tries = [e for e in harness.test_app.entries(run.id) if e.direction == "compensate_failed"]
    assert len(tries) == 3, "the reversal gets its compensation_retry attempts before halting"


def test_resume_retries_the_failed_reversal_and_finishes_each_step_once(harness: Harness) -> None:
    run, switch = _stuck_run(harness)
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK  # type: ignore[attr-defined]
    harness.test_app.set_switch(switch, False)
    harness.engine.resume_compensation(run.id)  # type: ignore[attr-defined]
    execution = run.wait(30)  # type: ignore[attr-defined]
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = [
        e.step
        for e in harness.test_app.entries(run.id)  # type: ignore[attr-defined]
        if e.direction == "compensate"
    ]
    assert undone == ["s3", "s2", "s1"]


def test_abandon_skips_outstanding_steps_and_the_run_can_never_reopen(harness: Harness) -> None:
    run, _ = _stuck_run(harness)
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK  # type: ignore[attr-defined]
    assert harness.engine.abandon_compensation(run.id) == 1  # type: ignore[attr-defined]
    execution = run.get()  # type: ignore[attr-defined]
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.STUCK
    assert execution.step("s1").compensation_status is CompensationOutcome.SKIPPED
    assert execution.step("s2").compensation_status is CompensationOutcome.FAILED
    for command in (harness.engine.resume_compensation, harness.engine.abandon_compensation):
        with pytest.raises(InvalidStateError, match="compensation_stuck"):
            command(run.id)  # type: ignore[attr-defined]
    assert run.get().record.version == execution.record.version  # type: ignore[attr-defined]


def test_operator_commands_on_a_run_in_the_wrong_state_are_refused(harness: Harness) -> None:
    run = harness.start("five", {"order": 8})
    execution = run.wait(30)
    with pytest.raises(InvalidStateError, match="it is completed"):
        harness.engine.resume_compensation(run.id)
    with pytest.raises(InvalidStateError, match="it is completed"):
        harness.engine.abandon_compensation(run.id)
    assert run.get().record.version == execution.record.version


def test_a_hung_reversal_times_out_by_default_and_parks_the_run(harness: Harness) -> None:
    # The "hanging" saga declares no compensation timeout: the engine default (4 s here) applies.
    run = harness.start("hanging", {"plan": {"b": {"fail": True}, "a": {"undo_sleep": 12}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    reason = execution.step("a").compensation_reason or ""
    assert reason.startswith("StepTimeoutError: reversal of step 'a'"), reason
