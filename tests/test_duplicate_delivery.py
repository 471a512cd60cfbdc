"""Guarantees 10 and 11: a node message delivered twice never runs a node twice.

On the services backends every message is also published twice by the workers themselves
(see conftest), so each test there runs with duplicates racing across two worker processes.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from celery_saga import ExecutionState
from celery_saga.decisions.admission import NodeMessage
from tests.conftest import Harness


def _forward_counts(harness: Harness, execution_id: str) -> Counter[tuple[str, str]]:
    return Counter(
        (e.step, e.detail)
        for e in harness.test_app.entries(execution_id)
        if e.direction == "forward"
    )


def test_same_node_message_delivered_twice_runs_the_step_once(harness: Harness) -> None:
    run = harness.start("five", {"order": 11, "plan": {"s1": {"sleep": 0.5}}})
    spec = harness.engine.definition("five").find_step("s1")
    harness.engine.executor.publisher.publish_node("five", spec, NodeMessage(run.id, 0, 0, 0, 1))
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    counts = _forward_counts(harness, run.id)
    assert set(counts.values()) == {1}
    assert len(counts) == 5


def test_stale_messages_after_the_run_ended_change_nothing(harness: Harness) -> None:
    run = harness.start("five", {"order": 12, "plan": {"s4": {"fail": True}}})
    before = run.wait(30)
    definition = harness.engine.definition("five")
    publisher = harness.engine.executor.publisher
    for node, name in enumerate(["s1", "s2", "s3", "s4", "s5"]):
        publisher.publish_node(
            "five", definition.find_step(name), NodeMessage(run.id, node, 0, 0, 1)
        )
    for name in ("s1", "s2", "s3"):
        publisher.publish_compensation("five", definition.find_step(name), run.id, name, 1)
    time.sleep(1.5)
    after = run.get()
    assert after.record.version == before.record.version
    entries = harness.test_app.entries(run.id)
    assert Counter(e.key for e in entries if e.direction == "compensate") == {
        f"{run.id}:{name}:0:compensate": 1 for name in ("s1", "s2", "s3")
    }


def test_two_workers_racing_on_duplicated_messages_apply_each_effect_once(harness: Harness) -> None:
    runs = []
    for order in range(12):
        plan = {"s4": {"fail": True}} if order % 3 == 0 else {}
        runs.append(harness.start("five", {"order": order, "plan": plan}))
    for run in runs:
        execution = run.wait(60)
        assert execution.state in (ExecutionState.COMPLETED, ExecutionState.FAILED)
        entries = harness.test_app.entries(run.id)
        forward = Counter((e.key, e.detail) for e in entries if e.direction == "forward")
        backward = Counter(e.key for e in entries if e.direction == "compensate")
        diagnosis = (
            execution.state,
            execution.failure_reason,
            [(r.name, r.status.value) for r in execution.steps],
            entries,
        )
        assert set(forward.values()) == {1}, diagnosis
        assert not backward or set(backward.values()) == {1}, backward


def test_retry_waits_in_a_countdown_not_in_a_worker_slot(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("the embedded worker cannot be inspected over the memory transport")
    run = harness.start("slow_retry", {"plan": {"a": {"fail_attempts": 1}}})
    deadline = time.monotonic() + 10
    while (
        run.get().steps == ()
        or run.get().step("a").attempts < 1
        or run.get().step("a").status.value != "pending"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    inspector = harness.test_app.app.control.inspect(timeout=2)
    # The retry is due 6-9 s after the failure; under load one inspection may get no reply.
    ask_until = time.monotonic() + 4
    while True:
        scheduled = [t for tasks in (inspector.scheduled() or {}).values() for t in tasks]
        ours = any(t["request"]["name"] == "slow_retry.a" for t in scheduled)
        if ours or time.monotonic() > ask_until:
            break
    active = [t for tasks in (inspector.active() or {}).values() for t in tasks]
    # The step's message is its own task's; the queue is this session's, the saga this test's.
    assert any(t["request"]["name"] == "slow_retry.a" for t in scheduled), scheduled
    assert not any(t.get("name") == "slow_retry.a" for t in active), active
    assert run.wait(30).state is ExecutionState.COMPLETED
