"""What a recovery sweep does with a run that has made no progress for a while.

A message can be lost between a committed outcome and the next publish (a crash, a broker
restart, the in-memory transport dropping it). The run is then live in the store with no
message to drive it; the sweep republishes what the cursor or the unwind plan says is next.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from celery_saga.decisions.unwind import UnwindKind, next_unwind_step
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus


class RecoveryKind(str, Enum):
    NOTHING = "nothing"
    REPUBLISH_POSITION = "republish_position"
    REPUBLISH_COMPENSATION = "republish_compensation"
    REPLAN_UNWIND = "replan_unwind"


@dataclass(frozen=True)
class Recovery:
    """REPUBLISH_POSITION: publish the cursor's messages afresh, plus ``retries`` (step name,
    attempt) for steps waiting on a retry whose message was lost. REPUBLISH_COMPENSATION:
    the reversal of ``record``. REPLAN_UNWIND: let the unwind plan finish or park the run."""

    kind: RecoveryKind
    retries: tuple[tuple[str, int], ...] = ()
    record: StepRecord | None = None


def _live(lease: datetime | None, now: datetime) -> bool:
    return lease is not None and lease > now


def decide_recovery(
    execution: ExecutionRecord,
    steps: Sequence[StepRecord],
    compensations: Collection[str],
    now: datetime,
    stale_after: timedelta,
) -> Recovery:
    """Pure: given a snapshot, what (if anything) must be republished."""
    if execution.updated_at > now - stale_after:
        return Recovery(RecoveryKind.NOTHING)
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
    return Recovery(RecoveryKind.NOTHING)
