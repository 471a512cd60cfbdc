"""A step attempt's history row: written in the transaction that records how the attempt
ended (on PostgreSQL's one-statement outcomes, by the statement itself:
``prepared.run_and_step_in_one``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from celery_saga.records import ReversalAttempt, StepAttempt
from celery_saga.store import prepared
from celery_saga.store.database import rowcount_in, to_db_time
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
    params = {
        "step_run": step.execution_id,
        "step_name": step.name,
        "attempt_at": to_db_time(now),
        "attempt_started": claimed_at(step),
        "attempt_detail": detail,
    }
    rowcount_in(connection, prepared.attempt_row(ended), params)


def claimed_at(step: StepAttempt) -> datetime | None:
    """When ``step``'s attempt began, as stored (None where it is not known)."""
    return None if step.claimed_at is None else to_db_time(step.claimed_at)


def write_reversal_row(
    connection: Connection,
    reversal: ReversalAttempt,
    ended: Kind,
    now: datetime,
    detail: str | None = None,
) -> None:
    """``write_row`` for a reversal attempt (its number and holder as its record says)."""
    params = {
        "step_run": reversal.execution_id,
        "step_name": reversal.name,
        "attempt_at": to_db_time(now),
        "attempt_started": started(reversal.claimed_at),
        "attempt_detail": detail,
    }
    rowcount_in(connection, prepared.attempt_row(ended, reversal=True), params)


def started(claimed: datetime | None) -> datetime | None:
    """An attempt's start as stored (None where it is not known)."""
    return None if claimed is None else to_db_time(claimed)
