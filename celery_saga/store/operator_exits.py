"""The operator's exits from a parked unwind: resume it (the failed reversal gets a fresh
set of attempts), resolve it (the failed reversal was done by hand; the unwind goes on) or
abandon it (the steps never reversed are marked skipped), each a compare-and-set on the run
that writes its history row with who acted."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, literal, select, update

from celery_saga.decisions.unwind import outstanding_steps, parked_reversal
from celery_saga.errors import ExecutionNotFoundError, InvalidStateError
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    StepRecord,
)
from celery_saga.store import flow, history, prepared
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.queries import load_execution_row, load_steps
from celery_saga.store.tables import executions, step_records
from celery_saga.store.tables import history as history_table


def _require_stuck(connection: Connection, execution_id: str, command: str) -> ExecutionRecord:
    record = load_execution_row(connection, execution_id)
    if record is None:
        raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
    if record.state is not ExecutionState.COMPENSATION_STUCK:
        raise InvalidStateError(
            f"{command} needs execution {execution_id!r} (saga {record.saga_name!r}) to be "
            f"compensation_stuck; it is {record.state.value}"
        )
    return record


def require_stuck(db: Database, execution_id: str, command: str) -> ExecutionRecord:
    """The run, if ``command`` may act on it; raises the operator's error otherwise."""
    with db.transaction() as connection:
        return _require_stuck(connection, execution_id, command)


def _move_stuck(
    connection: Connection, execution_id: str, command: str, now: datetime, **changes: Any
) -> ExecutionRecord:
    """The parked run ``command`` acts on, as it was read, after writing ``changes`` to it
    (compare-and-set on that read); raises the operator's error otherwise."""
    record = _require_stuck(connection, execution_id, command)
    result = connection.execute(
        update(executions)
        .where(executions.c.id == record.id, executions.c.version == record.version)
        .values(version=record.version + 1, updated_at=to_db_time(now), **changes)
    )
    if result.rowcount != 1:
        raise InvalidStateError(f"execution {record.id!r} changed concurrently; try again")
    return record


def resume_compensation(
    db: Database, execution_id: str, now: datetime, actor: str | None = None
) -> None:
    """Reopen a parked unwind: the failed reversal gets a fresh set of attempts. The
    ``resumed`` row keeps the attempts the reset forgets (``data``: step -> attempts), so
    the history counts every attempt a reversal had."""
    with db.transaction() as connection:
        record = _move_stuck(
            connection,
            execution_id,
            "resume_compensation",
            now,
            state=ExecutionState.COMPENSATING.value,
            rollback_status=None,
            rollback_reason=None,
        )
        steps = load_steps(connection, execution_id)
        reset = {
            step.name: step.compensation_attempts
            for step in steps
            if step.compensation_status in (None, CompensationOutcome.FAILED)
            and step.compensation_attempts
        }
        failed = [s.name for s in steps if s.compensation_status is CompensationOutcome.FAILED]
        connection.execute(
            update(step_records)
            .where(
                step_records.c.execution_id == execution_id,
                step_records.c.compensation_status == CompensationOutcome.FAILED.value,
            )
            .values(compensation_status=None, compensated_at=None, compensation_attempts=0)
        )
        # A reversal whose outcome could not be recorded still holds its claim: free it and
        # give it a fresh set of attempts, like a reversal that failed.
        connection.execute(
            update(step_records)
            .where(
                step_records.c.execution_id == execution_id,
                step_records.c.compensation_status.is_(None),
            )
            .values(compensation_lease_expires_at=None, compensation_attempts=0)
        )
        parked_at = failed[0] if failed else next(iter(reset), None)
        entry = HistoryEntry(
            now,
            Kind.RESUMED.value,
            step=parked_at,
            attempt=reset.get(parked_at) if parked_at else None,
            actor=actor,
            detail=record.rollback_reason,
            data=reset,
        )
        history.write(connection, execution_id, entry)


#: The reason a reversal done by hand carries: what every view shows of it.
BY_HAND = "done by hand"


def _resolvable(connection: Connection, record: ExecutionRecord, step: str) -> StepRecord:
    """The record of the parked reversal of ``step``, or the operator's error."""
    what = f"execution {record.id!r} (saga {record.saga_name!r})"
    parked = parked_reversal(load_steps(connection, record.id), record.committed_at is not None)
    if parked is None:
        raise InvalidStateError(
            f"{what} is parked on an outcome that could not be recorded, not on a "
            "reversal that failed: resume it instead"
        )
    if parked.name != step:
        raise InvalidStateError(
            f"{what} is parked at the reversal of step {parked.name!r}, not {step!r}; "
            "only the parked reversal can be resolved"
        )
    if parked.child_execution_id is not None:
        raise InvalidStateError(
            f"step {step!r} of {what} is the sub-saga run {parked.child_execution_id!r}: "
            "resume or abandon that run's own unwind"
        )
    return parked


def require_resolvable(db: Database, execution_id: str, step: str) -> ExecutionRecord:
    """The run, if ``resolve`` may act on the reversal of ``step``; the operator's error
    otherwise."""
    with db.transaction() as connection:
        record = _require_stuck(connection, execution_id, "resolve")
        _resolvable(connection, record, step)
        return record


def _resolved_already(
    connection: Connection, execution_id: str, step: str, note: str, actor: str | None
) -> bool:
    """Whether this very resolve (step, note, actor) is the run's last one of ``step``, on
    a run no longer parked: a call retried after its commit's reply was lost."""
    record = load_execution_row(connection, execution_id)
    if record is None or record.state is ExecutionState.COMPENSATION_STUCK:
        return False
    last = connection.execute(
        select(history_table.c.detail, history_table.c.actor)
        .where(
            history_table.c.execution_id == execution_id,
            history_table.c.kind == Kind.RESOLVED.value,
            history_table.c.step == step,
        )
        .order_by(history_table.c.id.desc())
        .limit(1)
    ).first()
    return last is not None and (last.detail, last.actor) == (note, actor)


def resolve_compensation(
    db: Database, execution_id: str, *, step: str, note: str, now: datetime, actor: str | None
) -> bool:
    """Record the parked reversal of ``step`` as done by hand (``resolved``, the reason
    naming ``actor`` and ``note``) and reopen the unwind at the step after it; False when
    this same resolve was stored already (a retry: nothing is written twice). Refused,
    nothing stored, unless the run is parked on a reversal of ``step`` that failed for
    good; first writer wins against resume, abandon and another resolve (the run's
    compare-and-set)."""
    with db.transaction() as connection:
        if _resolved_already(connection, execution_id, step, note, actor):
            return False
        record = _move_stuck(
            connection,
            execution_id,
            "resolve",
            now,
            state=ExecutionState.COMPENSATING.value,
            rollback_status=None,
            rollback_reason=None,
        )
        parked = _resolvable(connection, record, step)
        by = f" by {actor}" if actor else ""
        connection.execute(
            update(step_records)
            .where(
                step_records.c.id == parked.id,
                step_records.c.compensation_status == CompensationOutcome.FAILED.value,
            )
            .values(
                compensation_status=CompensationOutcome.RESOLVED.value,
                compensation_reason=f"{BY_HAND}{by}: {note}",
                compensated_at=to_db_time(now),
                compensation_lease_expires_at=None,
            )
        )
        entry = HistoryEntry(
            now,
            Kind.RESOLVED.value,
            step=step,
            attempt=parked.compensation_attempts,
            actor=actor,
            detail=note,
            data={"failed": parked.compensation_reason},
        )
        history.write(connection, execution_id, entry)
        return True


def abandon_compensation(
    db: Database,
    execution_id: str,
    *,
    now: datetime,
    actor: str | None,
    reason: str | None,
) -> int:
    """Close a parked unwind for good: outstanding steps become compensation_skipped;
    the ``abandoned`` row says who did it, why, and which steps stay unreversed."""
    with db.transaction() as connection:
        record = _move_stuck(
            connection,
            execution_id,
            "abandon_compensation",
            now,
            state=prepared.ending_state(literal(ExecutionState.FAILED.value)),
            rollback_status=RollbackStatus.STUCK.value,
        )
        outstanding = outstanding_steps(
            load_steps(connection, execution_id), record.committed_at is not None
        )
        for step in outstanding:
            connection.execute(
                update(step_records)
                .where(step_records.c.id == step.id)
                .values(
                    compensation_status=CompensationOutcome.SKIPPED.value,
                    compensation_reason="abandoned by operator",
                    compensated_at=to_db_time(now),
                    compensation_lease_expires_at=None,
                )
            )
        skipped = [step.name for step in outstanding]
        entry = HistoryEntry(
            now, Kind.ABANDONED.value, actor=actor, detail=reason, data={"skipped": skipped}
        )
        history.write(connection, execution_id, entry)
        if record.flow_key is not None:
            flow.release(connection, execution_id, now)
        return len(outstanding)
