"""What the unwind does next (guarantees 1-6, 8).

Eligible steps are those that started with a compensation declared, unless the run passed
its pivot. They are reversed in reverse start order (record id order), one at a time. A loop
iteration ``charge:2`` is its own record, reversed by the body step ``charge``'s
compensation; a sub-saga's record is reversed by running the child's own unwind.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from celery_saga.decisions.admission import Admission
from celery_saga.definition.nodes import split_iteration
from celery_saga.records import CompensationOutcome, RollbackStatus, StepRecord

#: Outcomes after which the unwind goes on to the next step.
SETTLED = frozenset(
    (CompensationOutcome.COMPENSATED, CompensationOutcome.SKIPPED, CompensationOutcome.RESOLVED)
)


class UnwindKind(str, Enum):
    COMPENSATE = "compensate"
    HALT_FAILED = "halt_failed"
    HALT_VANISHED = "halt_vanished"
    DONE = "done"


@dataclass(frozen=True)
class UnwindStep:
    kind: UnwindKind
    record: StepRecord | None = None
    rollback_status: RollbackStatus | None = None


def eligible_steps(records: Sequence[StepRecord], committed: bool) -> list[StepRecord]:
    """Steps owed a reversal, most recently started first. A failed step is eligible too."""
    if committed:
        return []
    return sorted((r for r in records if r.compensatable), key=lambda r: r.id, reverse=True)


def next_unwind_step(
    records: Sequence[StepRecord], committed: bool, compensations: Collection[str]
) -> UnwindStep:
    """``compensations``: names of steps whose compensation the deployed definition has
    (loop body steps by their bare name, sub-sagas by their record name)."""
    eligible = eligible_steps(records, committed)
    for record in eligible:
        if record.compensation_status in SETTLED:
            continue
        if record.compensation_status is CompensationOutcome.FAILED:
            return UnwindStep(UnwindKind.HALT_FAILED, record)
        if split_iteration(record.name)[0] not in compensations:
            return UnwindStep(UnwindKind.HALT_VANISHED, record)
        return UnwindStep(UnwindKind.COMPENSATE, record)
    status = RollbackStatus.COMPLETED if eligible else RollbackStatus.NOT_APPLICABLE
    return UnwindStep(UnwindKind.DONE, rollback_status=status)


def next_after_outcome(
    records: Sequence[StepRecord],
    committed: bool,
    compensations: Collection[str],
    name: str,
    outcome: CompensationOutcome,
    reason: str | None,
) -> UnwindStep:
    """The unwind's next move once the reversal of ``name`` has ``outcome``: decided before
    the outcome is written, so the write can carry the move (no step is reversed or started
    by anyone else while this reversal holds its claim)."""
    settled = [
        replace(r, compensation_status=outcome, compensation_reason=reason) if r.name == name else r
        for r in records
    ]
    return next_unwind_step(settled, committed, compensations)


def outstanding_steps(records: Sequence[StepRecord], committed: bool) -> list[StepRecord]:
    """Eligible steps with no outcome yet: what ``abandon_compensation`` marks skipped."""
    return [r for r in eligible_steps(records, committed) if r.compensation_status is None]


def parked_reversal(records: Sequence[StepRecord], committed: bool) -> StepRecord | None:
    """The reversal a parked unwind halted on (failed for good): what ``resolve`` may mark
    done by hand. None when the park was not a reversal's failure (an outcome that could
    not be recorded: only ``resume`` reopens that)."""
    return next(
        (
            r
            for r in eligible_steps(records, committed)
            if r.compensation_status is CompensationOutcome.FAILED
        ),
        None,
    )


def compensation_admission(
    record: StepRecord | None, planned: UnwindStep, attempt: int, lease_live: bool
) -> Admission:
    """May this compensate message run? Only for the plan's next step, still without an
    outcome and not held by a live claim; older attempts' duplicates are dropped."""
    if record is None or planned.kind is not UnwindKind.COMPENSATE or planned.record is None:
        return Admission.REJECT_NOT_LIVE
    if planned.record.id != record.id:
        return Admission.REJECT_STALE_CURSOR
    if record.compensation_status is not None:
        return Admission.REJECT_ALREADY_DONE
    if lease_live:
        return Admission.REJECT_IN_FLIGHT
    # The next attempt is owed; the current one too if its claim expired (its worker died
    # and the broker redelivered it). Older duplicates would skip the backoff: dropped.
    owed = {record.compensation_attempts + 1}
    if record.compensation_lease_expires_at is not None:
        owed.add(record.compensation_attempts)
    if attempt not in owed:
        return Admission.REJECT_STALE_ATTEMPT
    return Admission.RUN
