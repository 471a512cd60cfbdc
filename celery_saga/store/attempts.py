"""A step or reversal attempt's history row: written in the transaction that records how the attempt
ended (on PostgreSQL's one-statement outcomes, by the statement itself:
``prepared.run_and_step_in_one``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from celery_saga.records import ReversalAttempt, StepAttempt
from celery_saga.store import drivers, prepared
from celery_saga.store.database import to_db_time
from celery_saga.store.history import Kind


def write_row(
    connection: Connection,
    step: StepAttempt,
    ended: Kind,
    now: datetime,
    detail: str | None = None,
) -> None:
    """Add the history row of ``step``'s attempt, ended as ``ended`` at ``now``, inside
    the caller's transaction (the one that records how it ended)."""
    _write(connection, step.execution_id, step.name, step.claimed_at, ended, now, detail)


def write_reversal_row(
    connection: Connection,
    reversal: ReversalAttempt,
    ended: Kind,
    now: datetime,
    detail: str | None = None,
) -> None:
    """``write_row`` for a reversal attempt (its number and holder as its record says)."""
    claimed = reversal.claimed_at
    _write(connection, reversal.execution_id, reversal.name, claimed, ended, now, detail, True)


def _write(
    connection: Connection,
    execution_id: str,
    name: str,
    claimed: datetime | None,
    ended: Kind,
    now: datetime,
    detail: str | None,
    reversal: bool = False,
) -> None:
    params = {
        "step_run": execution_id,
        "step_name": name,
        "attempt_at": to_db_time(now),
        "attempt_started": started(claimed),
        "attempt_detail": detail,
    }
    drivers.rowcount(connection, prepared.attempt_row(ended, reversal), params)


def started(claimed: datetime | None) -> datetime | None:
    """An attempt's start as stored (None where it is not known)."""
    return None if claimed is None else to_db_time(claimed)
