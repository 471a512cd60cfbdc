"""Sub-saga decisions (guarantees 17, 18): what a parent does with its child, forward and
while unwinding, and whom a child that settled must notify."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from celery_saga.records import ExecutionRecord, ExecutionState, RollbackStatus, StepRecord

_LIVE = (
    ExecutionState.RUNNING,
    ExecutionState.WAITING,
    ExecutionState.COMPENSATING,
    ExecutionState.CANCELLING,
)


def unwind_owed(child: ExecutionRecord) -> bool:
    """Recorded failed but its unwind never started: the recovery sweep finishes it."""
    return child.state is ExecutionState.FAILED and child.rollback_status is None


def is_settled(child: ExecutionRecord) -> bool:
    """Terminal, or parked for an operator: nothing more happens to it on its own."""
    if unwind_owed(child):
        return False
    return child.state in (
        ExecutionState.COMPLETED,
        ExecutionState.FAILED,
        ExecutionState.CANCELLED,
        ExecutionState.COMPENSATION_STUCK,
    )


class ChildStep(str, Enum):
    START = "start"  # no child yet: start it (its id is fixed, so a second start adopts it)
    WAIT = "wait"  # the child is still going; it notifies the parent when it settles
    COMPLETE = "complete"
    FAIL = "fail"


def decide_child_step(child: ExecutionRecord | None) -> ChildStep:
    """The parent's node for a sub-saga is (re-)entered."""
    if child is None:
        return ChildStep.START
    if not is_settled(child):
        return ChildStep.WAIT
    return ChildStep.COMPLETE if child.state is ExecutionState.COMPLETED else ChildStep.FAIL


def child_failure(saga: str, child: ExecutionRecord) -> str:
    """The parent step's error: the child's own reason, readably."""
    reason = child.failure_reason or child.rollback_reason or child.state.value
    text = f"sub-saga {saga!r} ({child.id}) failed: {reason}"
    if child.state is ExecutionState.COMPENSATION_STUCK:
        text += f"; its unwind is stuck: {child.rollback_reason}"
    return text


class ChildReversalKind(str, Enum):
    START_UNWIND = "start_unwind"  # run the child's own compensation
    WAIT = "wait"  # the child's unwind is under way; it notifies the parent
    SETTLED = "settled"  # the child is unwound: the parent's record is compensated
    HALT = "halt"  # park the parent with ``reason``


@dataclass(frozen=True)
class ChildReversal:
    kind: ChildReversalKind
    reason: str | None = None


def decide_child_reversal(child: ExecutionRecord | None, child_id: str) -> ChildReversal:
    """The parent's unwind reached its record of a child."""
    halt = ChildReversalKind.HALT
    if child is None:
        return ChildReversal(halt, f"child execution {child_id} no longer exists")
    what = f"child saga {child.saga_name!r} ({child.id})"
    if child.state in (ExecutionState.RUNNING, ExecutionState.WAITING, ExecutionState.HELD):
        return ChildReversal(
            halt, f"{what} is still {child.state.value}; it cannot be unwound until it stops"
        )
    committed = child.committed_at is not None
    if committed and child.state in (ExecutionState.COMPLETED, ExecutionState.FAILED):
        return ChildReversal(halt, f"{what} is committed past its pivot; nothing was reversed")
    if child.state is ExecutionState.COMPLETED:
        return ChildReversal(ChildReversalKind.START_UNWIND)
    if child.state in (ExecutionState.COMPENSATING, ExecutionState.CANCELLING):
        return ChildReversal(ChildReversalKind.WAIT)
    if unwind_owed(child):
        return ChildReversal(ChildReversalKind.WAIT)
    if child.state is ExecutionState.COMPENSATION_STUCK:
        return ChildReversal(halt, f"{what} is parked mid-unwind: {child.rollback_reason}")
    if child.rollback_status is RollbackStatus.STUCK:
        return ChildReversal(halt, f"{what} was abandoned mid-unwind: {child.rollback_reason}")
    return ChildReversal(ChildReversalKind.SETTLED)


class Notify(str, Enum):
    NOTHING = "nothing"
    NODE = "node"  # the parent waits at the sub-saga node: publish that node
    COMPENSATION = "compensation"  # the parent's unwind waits on this child's reversal


def decide_notification(parent: ExecutionRecord | None, record: StepRecord | None) -> Notify:
    """A child settled; ``record`` is the parent's record of it."""
    if parent is None or record is None:
        return Notify.NOTHING
    if parent.state is ExecutionState.CANCELLING:
        return Notify.NODE  # the parent's cancel waits for its children to end
    if (
        parent.state is ExecutionState.RUNNING
        and (parent.cursor, parent.cursor_sub) == (record.node, record.sub)
        and record.completed_at is None
    ):
        return Notify.NODE
    if parent.state is ExecutionState.COMPENSATING and record.compensation_status is None:
        return Notify.COMPENSATION
    return Notify.NOTHING
