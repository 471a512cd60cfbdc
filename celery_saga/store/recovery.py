"""Finding runs that stopped moving, and claiming one for a single sweeper."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update

from celery_saga.records import ExecutionState
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.queries import keyset_after
from celery_saga.store.tables import executions

RECOVERABLE = (ExecutionState.RUNNING.value, ExecutionState.COMPENSATING.value)


def list_stale(
    db: Database, *, cutoff: datetime, limit: int, after: tuple[datetime, str] | None = None
) -> list[tuple[datetime, str]]:
    """(updated_at, id) of live runs not updated since ``cutoff`` (inclusive), oldest first,
    one page of ``limit`` after ``after``. Children are left to their parent's lifecycle."""
    query = (
        select(executions.c.updated_at, executions.c.id)
        .where(
            executions.c.state.in_(RECOVERABLE),
            executions.c.updated_at <= to_db_time(cutoff),
            executions.c.parent_execution_id.is_(None),
        )
        .order_by(executions.c.updated_at, executions.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(keyset_after(executions.c.updated_at, after))
    return [(row["updated_at"], row["id"]) for row in db.read(query)]


def claim_stale(db: Database, *, execution_id: str, seen_version: int, now: datetime) -> bool:
    """Compare-and-set on the version the sweeper decided on: with two sweepers (two beat
    processes, or beat and a starting worker) exactly one acts on a given snapshot."""
    with db.single_statement() as connection:
        result = connection.execute(
            update(executions)
            .where(
                executions.c.id == execution_id,
                executions.c.version == seen_version,
                executions.c.state.in_(RECOVERABLE),
            )
            .values(version=executions.c.version + 1, updated_at=to_db_time(now))
        )
        return bool(result.rowcount == 1)
