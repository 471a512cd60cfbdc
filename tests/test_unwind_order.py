"""Guarantees 1, 5, 6, 9, 19: reverse start order, exactly once, keys, failure reason."""

from __future__ import annotations

from celery_saga import CompensationOutcome, ExecutionState, RollbackStatus, StepStatus
from tests.conftest import Harness


def test_completed_saga_runs_every_step_once_with_its_forward_key(harness: Harness) -> None:
    run = harness.start("five", {"order": 1})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    forward = [e for e in harness.test_app.entries(run.id) if e.direction == "forward"]
    assert [e.step for e in forward] == ["s1", "s2", "s3", "s4", "s5"]
    for record in execution.steps:
        assert record.idempotency_key == f"{run.id}:{record.name}:0:forward"
    assert execution.rollback_status is None


def test_step_four_failing_compensates_three_two_one_once_each_in_order(harness: Harness) -> None:
    run = harness.start("five", {"order": 2, "plan": {"s4": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert execution.failure_reason == "ValueError: s4 refused order 2"
    undone = [e for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert [e.step for e in undone] == ["s3", "s2", "s1"]
    for entry in undone:
        assert entry.key == f"{run.id}:{entry.step}:0:compensate"
        assert entry.forward_key == f"{run.id}:{entry.step}:0:forward"
    outcomes = {r.name: r.compensation_status for r in execution.steps}
    assert outcomes == {
        "s1": CompensationOutcome.COMPENSATED,
        "s2": CompensationOutcome.COMPENSATED,
        "s3": CompensationOutcome.COMPENSATED,
        "s4": None,
    }


def test_failed_step_with_a_compensation_is_compensated_first(harness: Harness) -> None:
    run = harness.start("failed_eligible", {"plan": {"b": {"fail": True}}})
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    undone = [e.step for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert undone == ["b", "a"]
    assert execution.step("b").status is StepStatus.FAILED


def test_parallel_members_finishing_out_of_order_unwind_in_reverse_start_order(
    harness: Harness,
) -> None:
    plan = {
        "p1": {"sleep": 0.6},
        "p2": {"sleep": 0.3},
        "p3": {"sleep": 0.0},
        "last": {"fail": True},
    }
    run = harness.start("fanout", {"plan": plan})
    execution = run.wait(40)
    assert execution.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    members = [r for r in execution.steps if r.name.startswith("p")]
    by_start = [r.name for r in sorted(members, key=lambda r: r.id)]
    by_finish = [r.name for r in sorted(members, key=lambda r: r.completed_at)]
    assert by_start != by_finish, "members must finish out of start order for this test"
    undone = [e.step for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    expected = ["last", *reversed(by_start), "first"]
    assert undone == expected


def test_every_failure_of_a_parallel_group_is_named(harness: Harness) -> None:
    plan = {"p1": {"fail": True}, "p3": {"fail": True, "sleep": 0.2}}
    execution = harness.start("fanout", {"order": 5, "plan": plan}).wait(40)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert "step 'p1' failed: ValueError: p1 refused order 5" in (execution.failure_reason or "")
    assert "step 'p3' failed: ValueError: p3 refused order 5" in (execution.failure_reason or "")


def test_retry_keeps_the_forward_key_and_counts_attempts(harness: Harness) -> None:
    run = harness.start("five", {"order": 6, "plan": {"s3": {"fail_attempts": 1}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    attempts = [e for e in harness.test_app.entries(run.id) if e.step == "s3"]
    assert [e.detail for e in attempts] == ["attempt=1", "attempt=2"]
    assert {e.key for e in attempts} == {f"{run.id}:s3:0:forward"}
    assert execution.step("s3").attempts == 2


def test_pivot_means_nothing_is_compensated(harness: Harness) -> None:
    run = harness.start("pivoted", {"plan": {"b": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE
    assert execution.record.committed_at is not None
    assert [e for e in harness.test_app.entries(run.id) if e.direction == "compensate"] == []
    assert all(r.compensation_status is None for r in execution.steps)
