"""A step record's two claims, as one column map per direction.

One record carries the claim of its forward step (``status``, ``attempts``,
``lease_expires_at``, ``holder``) and the claim of its reversal (``compensation_status``
and the ``compensation_`` trio). ``Columns`` names one direction's columns, the status its
attempt holds the record in, and the kinds of its attempts' history rows; ``FORWARD`` and
``REVERSE`` are the two values. Whatever is true of a claim in both directions (which
attempt holds a record, how its lease is renewed, given up or released) is written once
over them (``claims``), in statements whose WHERE clause is the guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, bindparam

from celery_saga.records import Attempt, Direction, StepRecord, StepStatus
from celery_saga.store.history import Kind
from celery_saga.store.tables import step_records


@dataclass(frozen=True, eq=False)  # by identity: two values, keys of statement caches
class Columns:
    """One direction's claim on a step record."""

    status: Column[Any]
    #: The status while an attempt holds the record; None: it has no outcome yet (NULL).
    running: str | None
    attempts: Column[Any]
    lease: Column[Any]
    holder: Column[Any]
    #: Where a released attempt leaves its reason for the next one.
    reason: Column[Any]
    #: The status a released record waits in for its next attempt (None: unchanged).
    pending: str | None
    #: Kinds of the history rows of an attempt given up, released, and never settled.
    released: Kind
    retrying: Kind
    lost: Kind
    #: Bind parameter names of ``held_params``: run, record name, attempt, holder.
    params: tuple[str, str, str, str]
    #: Whether the attempt's history row reads the reversal's columns.
    reversal: bool

    def unsettled(self) -> ColumnElement[bool]:
        """The record has no outcome in this direction: an attempt still holds it."""
        if self.running is None:
            return self.status.is_(None)
        return self.status == self.running

    def held_of(self, record: StepRecord) -> tuple[int, str | None, datetime | None]:
        """The attempt number, holder and lease of this direction's claim on ``record``."""
        attempt: int = getattr(record, self.attempts.key)
        return attempt, getattr(record, self.holder.key), getattr(record, self.lease.key)


FORWARD = Columns(
    status=step_records.c.status,
    running=StepStatus.RUNNING.value,
    attempts=step_records.c.attempts,
    lease=step_records.c.lease_expires_at,
    holder=step_records.c.holder,
    reason=step_records.c.error,
    pending=StepStatus.PENDING.value,
    released=Kind.STEP_RELEASED,
    retrying=Kind.STEP_RETRYING,
    lost=Kind.STEP_LOST,
    params=("step_run", "step_name", "step_attempt", "step_holder"),
    reversal=False,
)
REVERSE = Columns(
    status=step_records.c.compensation_status,
    running=None,
    attempts=step_records.c.compensation_attempts,
    lease=step_records.c.compensation_lease_expires_at,
    holder=step_records.c.compensation_holder,
    reason=step_records.c.compensation_reason,
    pending=None,
    released=Kind.REVERSAL_RELEASED,
    retrying=Kind.REVERSAL_RETRYING,
    lost=Kind.REVERSAL_LOST,
    params=("run_id", "step_name", "attempt", "reversal_holder"),
    reversal=True,
)


def held(direction: Columns, attempt: Attempt) -> ColumnElement[bool]:
    """``attempt`` still holds its record in ``direction``: no outcome, its number, and
    where its holder is known its own (after a claim the store lost, another process may
    hold the same number: ``decisions/lost_claims.py``)."""
    guard = (
        (step_records.c.execution_id == attempt.execution_id)
        & (step_records.c.name == attempt.name)
        & direction.unsettled()
        & (direction.attempts == attempt.attempt)
    )
    if attempt.holder is not None:
        guard &= direction.holder == attempt.holder
    return guard


def held_params(direction: Columns) -> ColumnElement[bool]:
    """``held`` for statements built once: the attempt comes as the bind parameters
    ``direction.params`` (a holder of None: not known, any holder)."""
    run, name, number, holder = direction.params
    holder_param = bindparam(holder, type_=direction.holder.type)
    return (
        (step_records.c.execution_id == bindparam(run, type_=step_records.c.execution_id.type))
        & (step_records.c.name == bindparam(name, type_=step_records.c.name.type))
        & direction.unsettled()
        & (direction.attempts == bindparam(number, type_=direction.attempts.type))
        & (holder_param.is_(None) | (direction.holder == holder_param))
    )


def claimed(direction: Columns, lease: Any, holder: Any) -> dict[str, Any]:
    """The columns a claim in ``direction`` sets: the next attempt, its ``lease`` and
    ``holder`` (values, or bind parameters of a statement built once), and the status an
    attempt holds the record in where it has one."""
    values = {
        direction.attempts.key: direction.attempts + 1,
        direction.lease.key: lease,
        direction.holder.key: holder,
    }
    if direction.running is not None:
        values[direction.status.key] = direction.running
    return values


def held_values(direction: Columns, attempt: Attempt) -> dict[str, Any]:
    """The bind parameters of ``held_params`` for ``attempt``."""
    run, name, number, holder = direction.params
    return {
        run: attempt.execution_id,
        name: attempt.name,
        number: attempt.attempt,
        holder: attempt.holder,
    }


def columns(direction: Direction) -> Columns:
    """The column map of an attempt's ``direction``."""
    return FORWARD if direction is Direction.FORWARD else REVERSE
