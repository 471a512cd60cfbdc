"""Cancellation writes (guarantee 31): the cancel itself, then the unwind it leads to.

``request_cancel`` is one conditional write on the run row: it lands only while the run is
running or waiting and short of its pivot, so it and every forward write (a claim, a
completion, a signal, a wait's timeout) exclude each other, and the first one wins.
``begin_cancelled_unwind`` starts the unwind once no body of the run is in flight and no
child of it is still going; the unwind then ends ``cancelled`` (``prepared.ending_state``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, select, update

from celery_saga.decisions.cancel import CANCELLABLE_STATES, bodies_in_flight, interrupted_steps
from celery_saga.decisions.unwind import UnwindKind, UnwindStep
from celery_saga.records import ExecutionState, RollbackStatus, StepRecord, StepStatus
from celery_saga.store import history
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import fail_run_locked
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.queries import bump_and_load, bump_run, load_steps
from celery_saga.store.tables import executions, step_records

CANCELLABLE = tuple(s.value for s in CANCELLABLE_STATES)
#: A child of a cancelled run that has not ended yet: the parent's unwind waits for it.
_CHILD_GOING = (
    ExecutionState.QUEUED.value,
    ExecutionState.RUNNING.value,
    ExecutionState.WAITING.value,
    ExecutionState.HELD.value,
    ExecutionState.COMPENSATING.value,
    ExecutionState.CANCELLING.value,
)


#: The error of a step the cancel cut short (a body stopped, an attempt that will not come).
CUT_SHORT = "CancelledError: the run was cancelled while this step was due"


def cancel_reason(reason: str | None) -> str:
    return f"CancelledError: {reason}" if reason else "CancelledError: cancelled"


def request_cancel(
    db: Database, *, execution_id: str, reason: str, now: datetime, actor: str | None = None
) -> bool:
    """Store the cancel of a live run short of its pivot, with its ``cancelled`` history
    row naming ``actor``; False: not such a run (any more)."""
    live = (executions.c.state.in_(CANCELLABLE), executions.c.committed_at.is_(None))
    changes = {"state": ExecutionState.CANCELLING.value, "wake_at": None}
    return _cancel(db, execution_id, live, changes, now, actor, reason, reason)


def cancel_queued(
    db: Database, *, execution_id: str, reason: str, now: datetime, actor: str | None = None
) -> bool:
    """End a queued run ``cancelled`` before it started: it holds no flow-control slot and
    ran nothing, so nothing is unwound (guarantee 37). False: it is not queued (any more:
    a run of its key that ended started it first)."""
    queued = (executions.c.state == ExecutionState.QUEUED.value,)
    changes = {
        "state": ExecutionState.CANCELLED.value,
        "rollback_status": RollbackStatus.NOT_APPLICABLE.value,
        "flow_key": None,
    }
    detail = f"{reason} (while queued: it never started)"
    return _cancel(db, execution_id, queued, changes, now, actor, reason, detail)


def _cancel(
    db: Database,
    execution_id: str,
    where: tuple[ColumnElement[bool], ...],
    changes: Mapping[str, object],
    now: datetime,
    actor: str | None,
    reason: str,
    detail: str,
) -> bool:
    """One cancel write: the run row, only ``where`` it still stands, takes ``changes``,
    its reason and cancel time, and its ``cancelled`` history row (``detail``, ``actor``)
    is written in the same transaction; False: the row no longer matched."""
    stamp = to_db_time(now)
    with db.transaction() as connection:
        cancelled = bump_run(
            connection,
            execution_id,
            *where,
            cancelled_at=stamp,
            failure_reason=reason,
            deadline_at=None,
            updated_at=stamp,
            **changes,
        )
        if not cancelled:
            return False
        entry = HistoryEntry(now, Kind.CANCELLED.value, actor=actor, detail=detail)
        history.write(connection, execution_id, entry)
        return True


def begin_cancelled_unwind(
    db: Database, *, execution_id: str, compensations: Collection[str], now: datetime
) -> tuple[UnwindStep, str] | None:
    """Begin the unwind of a cancelled run, its interrupted steps recorded failed, with its
    ``unwind-begun`` history row naming them (and ``unwind-closed`` when nothing is owed a
    reversal); returns its first move and the run's reason. None while a body is in flight
    or a child is still going (whoever ends last comes back)."""
    try:
        with db.transaction() as connection:
            cancelling = executions.c.state == ExecutionState.CANCELLING.value
            run = bump_and_load(connection, execution_id, cancelling, updated_at=to_db_time(now))
            if run is None:
                return None
            steps = load_steps(connection, execution_id)
            if bodies_in_flight(steps, now) or _children_going(connection, steps):
                raise Conflict(execution_id)
            steps, cut_short = _cut_short(connection, steps, now)
            reason = run.failure_reason or cancel_reason(None)
            plan = fail_run_locked(
                connection,
                execution_id,
                reason,
                False,
                compensations,
                now,
                steps,
                holds_slot=run.flow_key is not None,
            )
            _write_begun(connection, execution_id, plan, reason, cut_short, now)
            return plan, reason
    except Conflict:
        return None


def _cut_short(
    connection: Connection, steps: list[StepRecord], now: datetime
) -> tuple[list[StepRecord], list[str]]:
    """Record failed the steps the cancel cut short; the steps as written (without reading
    them again), and the names of those cut short."""
    stamp = to_db_time(now)
    cut_short = {s.id for s in interrupted_steps(steps)}
    if not cut_short:
        return steps, []
    connection.execute(
        update(step_records)
        .where(step_records.c.id.in_(cut_short))
        .values(
            status=StepStatus.FAILED.value,
            error=CUT_SHORT,
            lease_expires_at=None,
            completed_at=stamp,
        )
    )
    written = [
        replace(
            s, status=StepStatus.FAILED, error=CUT_SHORT, lease_expires_at=None, completed_at=now
        )
        if s.id in cut_short
        else s
        for s in steps
    ]
    return written, [s.name for s in steps if s.id in cut_short]


def _write_begun(
    connection: Connection,
    execution_id: str,
    plan: UnwindStep,
    reason: str,
    cut_short: list[str],
    now: datetime,
) -> None:
    """The cancel's ``unwind-begun`` row, naming the steps it cut short; ``unwind-closed``
    after it when ``plan`` (the unwind's first move) finds nothing owed a reversal."""
    detail = (
        f"{reason}; cut short, recorded failed: {', '.join(cut_short)}" if cut_short else reason
    )
    data = {"cut_short": cut_short} if cut_short else None
    history.note(connection, execution_id, Kind.UNWIND_BEGUN, now, detail, data=data)
    if plan.kind is UnwindKind.DONE:
        assert plan.rollback_status is not None
        history.write_unwind_closed(connection, execution_id, plan.rollback_status, now)


def _children_going(connection: Connection, steps: list[StepRecord]) -> bool:
    children = [s.child_execution_id for s in steps if s.child_execution_id is not None]
    if not children:
        return False
    going = connection.execute(
        select(executions.c.id).where(
            executions.c.id.in_(children), executions.c.state.in_(_CHILD_GOING)
        )
    ).first()
    return going is not None


def list_overdue(db: Database, *, now: datetime, limit: int) -> list[str]:
    """Runs whose deadline has passed, earliest first (an index seek: only live runs keep a
    deadline)."""
    rows = db.read(
        select(executions.c.id)
        .where(executions.c.deadline_at <= to_db_time(now))
        .order_by(executions.c.deadline_at, executions.c.id)
        .limit(limit)
    )
    return [row["id"] for row in rows]


def clear_deadline(db: Database, execution_id: str) -> None:
    """Forget the deadline of a run it can no longer cancel (past its pivot, unwinding)."""
    with db.single_statement() as connection:
        connection.execute(
            update(executions).where(executions.c.id == execution_id).values(deadline_at=None)
        )
