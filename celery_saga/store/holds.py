"""Held runs: the hold itself, the operator's moves on it and its timeout. Each is one
transaction whose WHERE clause is the guarantee (first writer wins across hosts).

A hold is written where the step's final failure would be: only while the run is live at
the step and this attempt holds it. The step's record is settled failed (its error and
its attempts kept: a later unwind reverses it, guarantee 6), the run becomes ``held`` with
the error as its reason and, with a hold timeout, ``wake_at`` (the index the waits' sweep
uses, on (state, wake_at), serves the hold sweep alike).

Every move (retry, skip, unwind, the timeout's unwind, and a cancel, which is
``store/cancel.py``'s) is a compare-and-set on the run being ``held`` at the position the
mover read: the first one lands, every other finds the run moved and changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.holds import held_step_of
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.errors import ExecutionNotFoundError, InvalidStateError
from celery_saga.records import Attempt, ExecutionRecord, ExecutionState, StepRecord, StepStatus
from celery_saga.store import attempts, claims, history
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import (
    advance_values,
    fail_read_run,
    lock_execution,
    release_if_ending,
)
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.queries import load_execution_row, load_steps
from celery_saga.store.tables import executions, step_records


@dataclass(frozen=True)
class HeldRun:
    """A held run as a move read it: the run and its held step's record."""

    execution: ExecutionRecord
    step: StepRecord


def hold_step(
    db: Database, step: Attempt, *, error: str, hold_until: datetime | None, now: datetime
) -> bool:
    """Record ``step``'s final failure as a hold of its run, with the attempt's
    ``step-failed`` row and the run's ``held`` row; False: the run is no longer live at
    this step under this attempt (a cancel, a takeover): nothing was written."""
    stamp = to_db_time(now)
    until = None if hold_until is None else to_db_time(hold_until)
    try:
        with db.transaction() as connection:
            lock_execution(
                connection,
                step.execution_id,
                step.node,
                step.sub,
                now,
                state=ExecutionState.HELD.value,
                failure_reason=error,
                wake_at=until,
            )
            claims.settle(
                connection, step, status=StepStatus.FAILED.value, error=error, completed_at=stamp
            )
            attempts.write_row(connection, step, Kind.STEP_FAILED, now, error)
            data = {"attempts": step.attempt, "hold_until": until}
            history.note(
                connection, step.execution_id, Kind.HELD, now, error, step=step.name, data=data
            )
    except Conflict:
        return False
    return True


def read_held(db: Database, execution_id: str, move: str) -> HeldRun:
    """The held run ``move`` would act on; the operator's error, naming the run's state,
    when it is not held. Reads only."""
    with db.transaction() as connection:
        return _held(connection, execution_id, move)


def _held(connection: Connection, execution_id: str, move: str) -> HeldRun:
    record = load_execution_row(connection, execution_id)
    if record is None or record.id != execution_id:
        raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
    if record.state is not ExecutionState.HELD:
        raise InvalidStateError(
            f"{move} needs execution {execution_id!r} (saga {record.saga_name!r}) to be held; "
            f"it is {record.state.value}"
        )
    step = held_step_of(record, load_steps(connection, execution_id))
    if step is None:  # held at a paused step's door (store/pauses.py): no step failed
        raise InvalidStateError(
            f"{move} needs execution {execution_id!r} to be held by a failed step; it is held "
            f"at the door of a paused step ({record.failure_reason}): unpause releases it"
        )
    return HeldRun(record, step)


def _move_held(connection: Connection, held: HeldRun, now: datetime, **changes: Any) -> None:
    """Compare-and-set on the run as ``held`` read it (held, that version)."""
    run = held.execution
    result = connection.execute(
        update(executions)
        .where(
            executions.c.id == run.id,
            executions.c.version == run.version,
            executions.c.state == ExecutionState.HELD.value,
        )
        .values(version=run.version + 1, updated_at=to_db_time(now), **changes)
    )
    if result.rowcount != 1:
        raise InvalidStateError(
            f"execution {run.id!r} was moved by someone else meanwhile; nothing changed here"
        )


def _set_step(connection: Connection, step: StepRecord, **values: Any) -> None:
    """Write the held step's record, only as it was read (failed, that many attempts)."""
    result = connection.execute(
        update(step_records)
        .where(
            step_records.c.id == step.id,
            step_records.c.status == StepStatus.FAILED.value,
            step_records.c.attempts == step.attempts,
        )
        .values(**values)
    )
    if result.rowcount != 1:
        raise InvalidStateError(f"step {step.name!r} changed meanwhile; nothing changed here")


def retry_held(
    db: Database, execution_id: str, *, now: datetime, actor: str | None, reason: str | None
) -> HeldRun:
    """Run the held step again with a fresh attempt budget (its attempts count from zero;
    its key is its record's, unchanged); the ``hold-retried`` row keeps the attempts it
    had. Returns the run as it was held."""
    with db.transaction() as connection:
        held = _held(connection, execution_id, "retry")
        _move_held(
            connection,
            held,
            now,
            state=ExecutionState.RUNNING.value,
            failure_reason=None,
            wake_at=None,
        )
        _set_step(
            connection,
            held.step,
            status=StepStatus.PENDING.value,
            attempts=0,
            error=None,
            completed_at=None,
            lease_expires_at=None,
            holder=None,
        )
        _note(connection, held, Kind.HOLD_RETRIED, now, actor, reason)
        return held


def skip_held(
    db: Database,
    execution_id: str,
    *,
    result_blob: bytes,
    onward: Advance,
    expected: HeldRun,
    now: datetime,
    actor: str | None,
    reason: str | None,
) -> HeldRun:
    """Record the held step completed by hand with ``result_blob`` and move the run to
    ``onward``; only while the run is still as ``expected`` (read, and the result checked,
    before). The record stays reversible: a later unwind runs its reversal (its failed
    attempts may have had effects, guarantee 6)."""
    with db.transaction() as connection:
        held = _held(connection, execution_id, "skip")
        if held.execution.version != expected.execution.version:
            raise InvalidStateError(
                f"execution {execution_id!r} was moved by someone else meanwhile; "
                "nothing changed here"
            )
        moved = {
            "state": ExecutionState.RUNNING.value,
            "failure_reason": None,
            "wake_at": None,
            **advance_values(onward, now),
        }
        _move_held(connection, held, now, **moved)
        _set_step(
            connection,
            held.step,
            status=StepStatus.COMPLETED.value,
            result=result_blob,
            completed_at=to_db_time(now),
        )
        _note(connection, held, Kind.HOLD_SKIPPED, now, actor, reason)
        if onward.finished:
            history.note(
                connection, execution_id, Kind.RUN_COMPLETED, now, "its held last step was skipped"
            )
        release_if_ending(connection, onward, execution_id, now)
        return held


def unwind_held(
    db: Database,
    execution_id: str,
    *,
    compensations: Collection[str],
    now: datetime,
    actor: str | None,
    reason: str | None,
    due_by: datetime | None = None,
) -> tuple[HeldRun, UnwindStep]:
    """Fail the held run with its step's error and return the unwind's first move, as the
    step's failure would have under ``on_failure="unwind"``. Refused past the pivot
    (``InvalidStateError``; the caller names the pivot). ``due_by``: the hold timeout's
    sweep, which acts only on a hold whose timeout has passed by then."""
    with db.transaction() as connection:
        held = _held(connection, execution_id, "unwind")
        run = held.execution
        if run.committed_at is not None:
            raise InvalidStateError(
                f"execution {execution_id!r} (saga {run.saga_name!r}) has passed its pivot: "
                "it cannot be unwound, only retried or skipped"
            )
        if due_by is not None and (run.wake_at is None or run.wake_at > due_by):
            raise InvalidStateError(f"the hold of execution {execution_id!r} is not due")
        _move_held(connection, held, now)
        error = run.failure_reason or held.step.error or "held"
        kind = Kind.HOLD_UNWOUND
        _note(connection, held, kind, now, actor, reason)
        plan = fail_read_run(connection, run, error, compensations, now)
        return held, plan


def _note(
    connection: Connection,
    held: HeldRun,
    kind: Kind,
    now: datetime,
    actor: str | None,
    reason: str | None,
) -> None:
    entry = HistoryEntry(
        now,
        kind.value,
        step=held.step.name,
        attempt=held.step.attempts,
        actor=actor,
        detail=reason,
        data={"error": held.step.error, "attempts": held.step.attempts},
    )
    history.write(connection, held.execution.id, entry)


def list_expired_holds(db: Database, *, now: datetime, limit: int) -> list[str]:
    """Held runs whose hold timeout has passed, earliest first (an index seek on
    (state, wake_at), as the waits' sweep)."""
    rows = db.read(
        select(executions.c.id)
        .where(
            executions.c.state == ExecutionState.HELD.value,
            executions.c.wake_at <= to_db_time(now),
        )
        .order_by(executions.c.wake_at, executions.c.id)
        .limit(limit)
    )
    return [row["id"] for row in rows]
