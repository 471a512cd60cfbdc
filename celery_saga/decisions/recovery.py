"""What a recovery sweep does with a run that has made no progress for a while.

A message can be lost between a committed outcome and the next publish (a crash, a broker
restart, the in-memory transport dropping it). The run is then live in the store with no
message to drive it; the sweep republishes what the cursor or the unwind plan says is next.
A child run is driven through its parent: the parent's sweep recovers it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from celery_saga.decisions.children import ChildReversalKind, decide_child_reversal, is_settled
from celery_saga.decisions.unwind import UnwindKind, next_unwind_step
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus


class RecoveryKind(str, Enum):
    NOTHING = "nothing"
    REPUBLISH_POSITION = "republish_position"
    REPUBLISH_COMPENSATION = "republish_compensation"
    REPLAN_UNWIND = "replan_unwind"
    REOPEN_UNWIND = "reopen_unwind"
    RECOVER_CHILD = "recover_child"
    CONTINUE_CANCEL = "continue_cancel"


@dataclass(frozen=True)
class Recovery:
    """REPUBLISH_POSITION: publish the cursor's messages afresh, plus ``retries`` (step name,
    attempt) for steps waiting on a retry whose message was lost. REPUBLISH_COMPENSATION:
    the reversal of ``record``. REPLAN_UNWIND: let the unwind plan finish or park the run.
    CONTINUE_CANCEL: begin a cancelled run's unwind (guarantee 31).
    REOPEN_UNWIND: the run was recorded failed before its unwind started. RECOVER_CHILD:
    the run waits on its child ``record.child_execution_id``; recover that one instead."""

    kind: RecoveryKind
    retries: tuple[tuple[str, int], ...] = ()
    record: StepRecord | None = None


def _live(lease: datetime | None, now: datetime) -> bool:
    return lease is not None and lease > now


def waited_on_child(
    execution: ExecutionRecord, steps: Sequence[StepRecord], compensations: Collection[str]
) -> StepRecord | None:
    """The record of the child this run is waiting on, forward or in its unwind, if any."""
    if execution.state is ExecutionState.RUNNING:
        here = (execution.cursor, execution.cursor_sub)
        return next(
            (
                s
                for s in steps
                if (s.node, s.sub) == here
                and s.child_execution_id is not None
                and s.status is StepStatus.RUNNING
            ),
            None,
        )
    if execution.state is ExecutionState.COMPENSATING:
        plan = next_unwind_step(steps, execution.committed_at is not None, compensations)
        if plan.kind is UnwindKind.COMPENSATE and plan.record is not None:
            return plan.record if plan.record.child_execution_id is not None else None
    return None


def decide_recovery(
    execution: ExecutionRecord,
    steps: Sequence[StepRecord],
    compensations: Collection[str],
    now: datetime,
    stale_after: timedelta,
    child: ExecutionRecord | None = None,
) -> Recovery:
    """Pure: given a snapshot (and the child it waits on), what must be republished."""
    if execution.updated_at > now - stale_after:
        return Recovery(RecoveryKind.NOTHING)
    if execution.state is ExecutionState.CANCELLING:
        # A cancel whose unwind has not begun: begun now if nothing of the run still goes.
        return Recovery(RecoveryKind.CONTINUE_CANCEL)
    holder = waited_on_child(execution, steps, compensations)
    if holder is not None and child is not None:
        waiting = (
            not is_settled(child)
            if execution.state is ExecutionState.RUNNING
            else decide_child_reversal(child, child.id).kind is ChildReversalKind.WAIT
        )
        if waiting:
            return Recovery(RecoveryKind.RECOVER_CHILD, record=holder)
    if execution.state is ExecutionState.RUNNING:
        here = [s for s in steps if (s.node, s.sub) == (execution.cursor, execution.cursor_sub)]
        if any(s.status is StepStatus.RUNNING and _live(s.lease_expires_at, now) for s in here):
            return Recovery(RecoveryKind.NOTHING)
        retries = tuple((s.name, s.attempts + 1) for s in here if s.status is StepStatus.PENDING)
        return Recovery(RecoveryKind.REPUBLISH_POSITION, retries)
    if execution.state is ExecutionState.COMPENSATING:
        plan = next_unwind_step(steps, execution.committed_at is not None, compensations)
        record = plan.record
        if plan.kind is UnwindKind.COMPENSATE and record is not None:
            if _live(record.compensation_lease_expires_at, now):
                return Recovery(RecoveryKind.NOTHING)
            return Recovery(RecoveryKind.REPUBLISH_COMPENSATION, record=record)
        return Recovery(RecoveryKind.REPLAN_UNWIND)
    if execution.state is ExecutionState.FAILED and execution.rollback_status is None:
        return Recovery(RecoveryKind.REOPEN_UNWIND)
    return Recovery(RecoveryKind.NOTHING)


def left_to_running(
    execution: ExecutionRecord,
    steps: Sequence[StepRecord],
    action: Recovery,
    running: Collection[str],
) -> bool:
    """Pure: whether the sweep leaves a run it would send again to the processes still
    running it (``running``: the holders the workers named): only where the store records
    no claim for it (``claim_missing``)."""
    return bool(running) and claim_missing(execution, steps, action)


def claim_missing(
    execution: ExecutionRecord, steps: Sequence[StepRecord], action: Recovery
) -> bool:
    """Pure: whether what the sweep would send again has no claim in the store. A process
    still running it then runs on a claim the store lost (a crash, a failover) and writes it
    back (guarantee 30): the workers are asked. Where a claim is recorded, its lease lapsed:
    its message goes out and its holder is asked, and fenced if it is cut off; waiting
    instead could last as long as a body nobody can stop runs (a threads pool's, one taken
    over)."""
    if action.kind is RecoveryKind.REPUBLISH_POSITION:
        here = (execution.cursor, execution.cursor_sub)
        held = ((s.node, s.sub) == here and s.status is StepStatus.RUNNING for s in steps)
        return not any(held)
    if action.kind is RecoveryKind.REPUBLISH_COMPENSATION and action.record is not None:
        return action.record.compensation_lease_expires_at is None
    return False
