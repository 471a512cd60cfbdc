"""Sub-sagas (guarantees 17, 18): a parent adopts the child it started, is notified when the
child settles (no worker held, no polling), and unwinds it through the child's own
compensation; a child that cannot be cleanly unwound parks the parent."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from celery_saga import (
    CompensationOutcome,
    ExecutionNotFoundError,
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaContext,
    SagaEngine,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.runtime import forward_moves
from celery_saga.runtime.children import child_execution_id
from celery_saga.store import recovery
from celery_saga.store.tables import executions
from tests.conftest import Harness


def _child(harness: Harness, parent_id: str, record: str = "child") -> Any:
    child_id = harness.engine.get(parent_id).step(record).child_execution_id
    assert child_id == child_execution_id(parent_id, record)
    return harness.engine.get(child_id)


def _children_of(engine: SagaEngine, parent_id: str) -> int:
    with engine.db.transaction() as connection:
        query = select(func.count()).where(executions.c.parent_execution_id == parent_id)
        return int(connection.execute(query).scalar_one())


def _undone(harness: Harness, run_id: str) -> list[str]:
    return [e.step for e in harness.test_app.entries(run_id) if e.direction == "compensate"]


def _settled(run: Any) -> Any:
    return run.wait(30, states=[ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK])


def test_a_parent_runs_its_child_to_completion_and_takes_its_results(harness: Harness) -> None:
    run = harness.start("parent", {"order": 100})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    child = _child(harness, run.id)
    assert child.state is ExecutionState.COMPLETED
    assert child.record.parent_execution_id == run.id
    assert child.record.input == {"order": 100, "plan": {}}
    assert execution.results["child"] == child.results
    assert [s.name for s in execution.steps] == ["p1", "child", "p2"]
    assert _children_of(harness.engine, run.id) == 1


def test_a_failing_child_fails_the_parent_with_its_own_reason_and_each_unwinds_once(
    harness: Harness,
) -> None:
    run = harness.start("parent", {"order": 101, "child_plan": {"c2": {"fail": True}}})
    execution = _settled(run)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    child = _child(harness, run.id)
    assert execution.failure_reason == (
        f"sub-saga 'child' ({child.id}) failed: ValueError: c2 refused order 101"
    )
    assert (child.state, child.rollback_status) == (ExecutionState.FAILED, RollbackStatus.COMPLETED)
    assert _undone(harness, child.id) == ["c2", "c1"]
    assert _undone(harness, run.id) == ["p1"]
    assert execution.step("child").compensation_status is CompensationOutcome.COMPENSATED


def test_a_parent_failing_later_unwinds_its_completed_child_through_the_childs_compensation(
    harness: Harness,
) -> None:
    run = harness.start("parent", {"order": 102, "plan": {"p2": {"fail": True}}})
    execution = _settled(run)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    child = _child(harness, run.id)
    assert (child.state, child.rollback_status) == (ExecutionState.FAILED, RollbackStatus.COMPLETED)
    assert "its parent saga 'parent'" in (child.failure_reason or "")
    assert _undone(harness, child.id) == ["c2", "c1"]
    assert _undone(harness, run.id) == ["p1"]
    child_undone = max(s.compensated_at for s in child.steps if s.compensated_at)
    assert execution.step("p1").compensated_at >= child_undone, "reverse start order"  # type: ignore[operator]


def test_a_child_parked_mid_unwind_parks_the_parent_and_resume_reaches_it(
    harness: Harness,
) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    data = {
        "order": 103,
        "plan": {"p2": {"fail": True}},
        "child_plan": {"c1": {"undo_switch": switch}},
    }
    run = harness.start("parent", data)
    execution = _settled(run)
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    child = _child(harness, run.id)
    assert child.state is ExecutionState.COMPENSATION_STUCK
    assert "is parked mid-unwind" in (execution.record.rollback_reason or "")
    assert execution.step("p1").compensation_status is None, "the unwind halted at the child"
    harness.test_app.set_switch(switch, False)
    harness.engine.resume_compensation(run.id)
    execution = run.wait(30, states=[ExecutionState.FAILED])
    assert execution.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    assert _child(harness, run.id).rollback_status is RollbackStatus.COMPLETED
    assert _undone(harness, run.id) == ["p1"]


def test_abandoning_a_parent_abandons_the_parked_child_it_halted_on(harness: Harness) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    data = {
        "order": 104,
        "plan": {"p2": {"fail": True}},
        "child_plan": {"c1": {"undo_switch": switch}},
    }
    run = harness.start("parent", data)
    assert _settled(run).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    assert harness.engine.abandon_compensation(run.id) == 1  # p1; the child keeps its failure
    execution = run.get()
    assert (execution.state, execution.rollback_status) == (
        ExecutionState.FAILED,
        RollbackStatus.STUCK,
    )
    child = _child(harness, run.id)
    assert (child.state, child.rollback_status) == (ExecutionState.FAILED, RollbackStatus.STUCK)
    assert child.step("c1").compensation_status is CompensationOutcome.FAILED
    with pytest.raises(Exception, match="compensation_stuck"):
        harness.engine.resume_compensation(child.id)  # an abandoned run is never reopened


def test_a_child_committed_past_its_pivot_parks_the_parent(harness: Harness) -> None:
    run = harness.start("committing_parent", {"order": 105, "plan": {"z1": {"fail": True}}})
    execution = _settled(run)
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    assert "is committed past its pivot; nothing was reversed" in (
        execution.record.rollback_reason or ""
    )
    child = _child(harness, run.id, "committed_child")
    assert child.state is ExecutionState.COMPLETED, "a committed child is left as it is"
    assert _undone(harness, child.id) == []
    if not harness.in_process:  # Celery shows the parent's reversal of its child as failed
        assert """StepFailed("reversal of step 'committed_child'""" in harness.worker_logs()


def test_waiting_children_hold_no_worker_and_notify_their_parents(harness: Harness) -> None:
    parents = [harness.start("gated_parent", {"order": 110 + i}) for i in range(5)]
    children = []
    for parent in parents:
        deadline = time.monotonic() + 30
        while True:
            record = parent.get().steps
            if record and record[0].child_execution_id:
                child = harness.engine.handle(record[0].child_execution_id)
                # The record names the child a moment before the child's row is written.
                with contextlib.suppress(ExecutionNotFoundError):
                    if child.get().state is ExecutionState.WAITING:
                        break
            assert time.monotonic() < deadline, harness.worker_logs()
            time.sleep(0.05)
        children.append(child)
        assert parent.get().steps[0].lease_expires_at is None, "no lease: nothing runs for it"
    versions = [p.get().record.version for p in parents]
    # Five parents wait on five children, more than the workers have slots: if a parent
    # held a slot while waiting, this run could not get one.
    assert harness.start("five", {"order": 120}).wait(30).state is ExecutionState.COMPLETED
    assert [p.get().record.version for p in parents] == versions, "no parent polled"
    for child in children:
        harness.engine.signal(child.id, "go")
    for parent in parents:
        assert parent.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()


# -- direct drive ---------------------------------------------------------------------------


def _family(engine: SagaEngine) -> tuple[str, str]:
    child, parent = f"kid{uuid.uuid4().hex[:6]}", f"mum{uuid.uuid4().hex[:6]}"
    engine.register(
        Saga(child).step("k", lambda: "k", compensate=lambda: None),
        Saga(parent).step("first", lambda: 1).sub_saga(child).step("last", lambda: 2),
    )
    return parent, child


def test_re_entering_the_node_adopts_the_child_it_already_started(
    direct: SagaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, child = _family(direct)
    run = direct.start(parent)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), parent)
    real, crashed = forward_moves.create, []

    def dies_before_creating_the_child(*args: Any, **kwargs: Any) -> None:
        if not crashed:
            crashed.append(True)
            raise KeyboardInterrupt  # the worker dies between the claim and the child
        real(*args, **kwargs)

    monkeypatch.setattr(forward_moves, "create", dies_before_creating_the_child)
    with pytest.raises(KeyboardInterrupt):
        direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), parent)
    assert _children_of(direct, run.id) == 0
    for redelivered in (True, False, True):
        direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), parent, redelivered)
    assert _children_of(direct, run.id) == 1, "one child, whatever re-entered the node"
    child_id = child_execution_id(run.id, child)
    direct.executor.run_node(NodeMessage(child_id, 0, 0, 0, 1), child)
    assert direct.get(child_id).state is ExecutionState.COMPLETED
    direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), parent)  # the notification
    direct.executor.run_node(NodeMessage(run.id, 2, 0, 0, 1), parent)
    assert direct.get(run.id).state is ExecutionState.COMPLETED


def test_a_child_is_recovered_through_its_parent_never_on_its_own(
    direct: SagaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, child = _family(direct)
    run = direct.start(parent)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), parent)
    direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), parent)
    child_id = child_execution_id(run.id, child)  # its first message is lost: never delivered
    time.sleep(0.05)
    stale = {i for _, i in recovery.list_stale(direct.db, cutoff=_now(), limit=10**6)}
    assert child_id not in stale and run.id in stale
    published: list[NodeMessage] = []
    publisher = direct.executor.publisher
    real = publisher.publish_node

    def spy(saga: str, spec: Any, message: NodeMessage, *args: Any, **kwargs: Any) -> None:
        published.append(message)
        real(saga, spec, message, *args, **kwargs)

    monkeypatch.setattr(publisher, "publish_node", spy)
    assert direct.recover(stale_after=0) >= 1  # the servers' stores hold other tests' runs
    ours = [m for m in published if m.execution_id in (run.id, child_id)]
    assert ours == [NodeMessage(child_id, 0, 0, 0, 1)], "the parent's sweep drove it"
    with direct.db.transaction() as connection:  # an orphan is nobody's: recovered alone
        connection.execute(delete(executions).where(executions.c.id == run.id))
    stale = {i for _, i in recovery.list_stale(direct.db, cutoff=_now(), limit=10**6)}
    assert child_id in stale


def test_a_sub_saga_input_that_is_not_a_mapping_fails_the_parent_clearly(
    direct: SagaEngine,
) -> None:
    child = f"kid{uuid.uuid4().hex[:6]}"
    parent = f"mum{uuid.uuid4().hex[:6]}"

    def bad_input(ctx: SagaContext) -> Any:
        return ["not", "a", "mapping"]

    direct.register(
        Saga(child).step("k", lambda: "k"),
        Saga(parent)
        .step("first", lambda: 1, compensate=lambda: None)
        .sub_saga(child, input=bad_input),
    )
    run = direct.start(parent)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), parent)
    direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), parent)
    execution = direct.get(run.id)
    assert execution.state is ExecutionState.COMPENSATING
    assert execution.failure_reason == (
        f"SubSagaError: saga {parent!r}: the input of sub_saga {child!r} must be a mapping "
        "(dict), got list"
    )
    assert _children_of(direct, run.id) == 0


def _now() -> Any:
    from celery_saga import get_clock

    return get_clock().now()
