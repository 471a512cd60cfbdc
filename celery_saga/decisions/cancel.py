"""May a run be cancelled, and may its cancelled unwind begin? (guarantee 31)

A cancel is stored as the run's state, ``cancelling``: from then on every forward write
(a claim, a completion, a signal, a wait's timeout) finds the run no longer running and
changes nothing, so the first writer wins. Bodies in flight are stopped; once none is, the
run unwinds as a failed one would, the interrupted steps included (guarantee 6), and ends
``cancelled``. A run past its pivot, or already ended, is refused; one already unwinding
is left alone (its compensations are never interrupted).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import Enum

from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus


class CancelVerdict(str, Enum):
    CANCEL = "cancel"
    #: Refused: past the pivot, the point of no return.
    PAST_PIVOT = "past_pivot"
    #: Refused: the run has ended.
    ENDED = "ended"
    #: Nothing to do: a cancel is already under way, or done.
    ALREADY_CANCELLED = "already_cancelled"
    #: Nothing to do: the run is unwinding; its compensations are not interrupted.
    UNWINDING = "unwinding"


#: The states a cancel acts on (a held run too: its operator may give it up; a queued run
#: ends without starting).
CANCELLABLE_STATES = (
    ExecutionState.QUEUED,
    ExecutionState.RUNNING,
    ExecutionState.WAITING,
    ExecutionState.HELD,
)


def decide_cancel(execution: ExecutionRecord) -> CancelVerdict:
    """Pure: what a cancel of ``execution`` does."""
    state = execution.state
    if execution.cancelled_at is not None or state is ExecutionState.CANCELLED:
        return CancelVerdict.ALREADY_CANCELLED  # cancelling, its unwind, or done
    if state in (ExecutionState.COMPENSATING, ExecutionState.COMPENSATION_STUCK):
        return CancelVerdict.UNWINDING
    if state not in CANCELLABLE_STATES:
        return CancelVerdict.ENDED
    if execution.committed_at is not None:
        return CancelVerdict.PAST_PIVOT
    return CancelVerdict.CANCEL


def bodies_in_flight(steps: Sequence[StepRecord], now: datetime) -> list[StepRecord]:
    """The steps whose body may still run: claimed, with a live lease."""
    return [
        s
        for s in steps
        if s.status is StepStatus.RUNNING
        and s.lease_expires_at is not None
        and s.lease_expires_at > now
    ]


def interrupted_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """Steps the cancel cut short (a body stopped, an attempt that will not come): recorded
    failed as the unwind begins; they are reversed like any failed step."""
    return [
        s
        for s in steps
        if s.status in (StepStatus.RUNNING, StepStatus.PENDING) and s.child_execution_id is None
    ]
