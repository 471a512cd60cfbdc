"""The operator's exits from a parked unwind: resume it (the failed reversal gets a fresh
set of attempts) or abandon it (the steps never reversed are marked skipped), each a
compare-and-set on the run that writes its history row with who acted."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, literal, update

from celery_saga.decisions.unwind import outstanding_steps
from celery_saga.errors import ExecutionNotFoundError, InvalidStateError
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
)
from celery_saga.store import flow, history, prepared
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.queries import load_execution_row, load_steps
from celery_saga.store.tables import executions, step_records


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
