"""A step or reversal attempt's history row: written in the transaction that records how the attempt
ended (on PostgreSQL's one-statement outcomes, by the statement itself:
``prepared.run_and_step_in_one``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from celery_saga.records import Attempt
from celery_saga.store import drivers, prepared
from celery_saga.store.database import to_db_time
from celery_saga.store.history import Kind


def write_row(
    connection: Connection,
    attempt: Attempt | Attempt,
    ended: Kind,
    now: datetime,
    detail: str | None = None,
    *,
    reversal: bool = False,
) -> None:
    """Add the history row of ``attempt``, ended as ``ended`` at ``now``, inside the
    caller's transaction (the one that records how it ended); its number and holder as
    its record says (with ``reversal``, the record's reversal columns)."""
    params = {
        "step_run": attempt.execution_id,
        "step_name": attempt.name,
        "attempt_at": to_db_time(now),
        "attempt_started": started(attempt.claimed_at),
        "attempt_detail": detail,
    }
    drivers.rowcount(connection, prepared.attempt_row(ended, reversal), params)


def started(claimed: datetime | None) -> datetime | None:
    """An attempt's start as stored (None where it is not known)."""
    return None if claimed is None else to_db_time(claimed)
