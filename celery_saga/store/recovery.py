"""Finding runs that stopped moving, and claiming one for a single sweeper.

A live run (running or compensating) whose ``wake_at`` is set has a message owed: its last
transition was recorded but the message it implies could not be sent (the broker was
down) or it is unknown what was sent. The timer sweep, every few seconds, sends it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, text, update

from celery_saga.records import ExecutionState
from celery_saga.store import history
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.history import Kind
from celery_saga.store.queries import bump_run, keyset_after, top_level
from celery_saga.store.step_lines import waits_at_its_door
from celery_saga.store.tables import executions


def _recoverable() -> Any:
    """Live runs, and runs recorded failed whose unwind never started."""
    return or_(
        executions.c.state.in_(
            (
                ExecutionState.RUNNING.value,
                ExecutionState.COMPENSATING.value,
                ExecutionState.CANCELLING.value,
            )
        ),
        (executions.c.state == ExecutionState.FAILED.value)
        & executions.c.rollback_status.is_(None),
    )


def list_stale(
    db: Database, *, cutoff: datetime, limit: int, after: tuple[datetime, str] | None = None
) -> list[tuple[datetime, str]]:
    """(updated_at, id) of recoverable runs not updated since ``cutoff`` (inclusive), oldest
    first, one page of ``limit`` after ``after``. A child is left to its parent's sweep,
    unless its parent is gone; a run waiting at a limited step's door, to the door."""
    query = (
        select(executions.c.updated_at, executions.c.id)
        .where(
            _recoverable(),
            executions.c.updated_at <= to_db_time(cutoff),
            top_level(),
            ~waits_at_its_door(cutoff),
        )
        .order_by(executions.c.updated_at, executions.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(keyset_after(executions.c.updated_at, after))
    return [(row["updated_at"], row["id"]) for row in db.read(query, serial=True)]


def claim_stale(
    db: Database,
    *,
    execution_id: str,
    seen_version: int,
    now: datetime,
    action: str,
    actor: str | None = None,
) -> bool:
    """Compare-and-set on the version the sweeper decided on: with two sweepers (two beat
    processes, or beat and a starting worker) exactly one acts on a given snapshot; it
    records the ``recovered`` history row (``action``: what the sweep does; ``actor``: the
    operator who ran the sweep, None for beat's)."""
    with db.transaction() as connection:
        seen = executions.c.version == seen_version
        if not bump_run(connection, execution_id, seen, _recoverable(), updated_at=to_db_time(now)):
            return False
        history.note(connection, execution_id, Kind.RECOVERED, now, action, actor=actor)
        return True


def _live() -> Any:
    return executions.c.state.in_((ExecutionState.RUNNING.value, ExecutionState.COMPENSATING.value))


def mark_message_owed(db: Database, *, execution_id: str, now: datetime) -> bool:
    """Ask the timer sweep to send the next message of a live run from ``now`` on."""
    with db.single_statement() as connection:
        result = connection.execute(
            update(executions)
            .where(executions.c.id == execution_id, _live())
            .values(wake_at=to_db_time(now))
        )
        return bool(result.rowcount == 1)


def list_owed(db: Database, *, now: datetime, limit: int) -> list[tuple[str, int]]:
    """(id, version) of live runs owed a message, oldest mark first."""
    query = (
        select(executions.c.id, executions.c.version)
        .where(_live(), executions.c.wake_at <= to_db_time(now))
        .order_by(executions.c.wake_at, executions.c.id)
        .limit(limit)
    )
    return [(row["id"], row["version"]) for row in db.read(query)]


def claim_owed(db: Database, *, execution_id: str, seen_version: int, now: datetime) -> bool:
    """Clear the mark for exactly one sweeper (compare-and-set on the version it read)."""
    with db.single_statement() as connection:
        return bump_run(
            connection,
            execution_id,
            executions.c.version == seen_version,
            executions.c.wake_at.is_not(None),
            _live(),
            wake_at=None,
            updated_at=to_db_time(now),
        )


def seconds_since_start(db: Database) -> float | None:
    """How long the database server has been up; None where there is no server (SQLite).
    A server that starts again after a crash may have lost the last claims, which their
    live holders write back at their next renewal (guarantee 30): the recovery sweep waits
    for them."""
    if db.dialect == "postgresql":
        uptime = func.extract("epoch", func.now() - func.pg_postmaster_start_time())
        rows = db.read(select(uptime.label("uptime")))
        return float(rows[0]["uptime"])
    if db.dialect in ("mysql", "mariadb"):
        rows = db.read(text("SHOW GLOBAL STATUS LIKE 'Uptime'"))
        return float(rows[0]["Value"]) if rows else None  # a proxy may not pass it on
    return None
