"""Cleanup and archive of old terminal executions (guarantee 23).

Only terminal runs whose retention has passed (cutoff inclusive) are touched, together with
their child runs, and only when every one of those children is terminal too: a parked or
waiting run is never removed. Candidates are claimed with ``FOR UPDATE SKIP LOCKED`` where
the database has it, so two beat processes split the work instead of colliding.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, literal, or_, select

from celery_saga.records import ExecutionState
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.queries import keyset_after, top_level
from celery_saga.store.tables import ARCHIVES, executions, executions_archive


def _terminal(table: Any) -> Any:
    """Completed, or failed with its unwind finished (a failed run still owed its unwind
    is recovered, not retired)."""
    return or_(
        table.c.state == ExecutionState.COMPLETED.value,
        and_(table.c.state == ExecutionState.FAILED.value, table.c.rollback_status.is_not(None)),
    )


def _claim_candidates(
    connection: Connection, cutoff: datetime, limit: int, after: tuple[datetime, str] | None
) -> list[tuple[datetime, str]]:
    """(updated_at, id) of top-level (or orphaned) terminal runs not updated since
    ``cutoff``, after ``after`` in that order, locked for this transaction."""
    query = (
        select(executions.c.updated_at, executions.c.id)
        .where(
            _terminal(executions),
            executions.c.updated_at <= to_db_time(cutoff),
            # Implied (a run is updated after it is created), and what the index on
            # (state, created_at) can seek: updated_at is in no index (migration 0003).
            executions.c.created_at <= to_db_time(cutoff),
            top_level(),
        )
        .order_by(executions.c.updated_at, executions.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    if after is not None:
        query = query.where(keyset_after(executions.c.updated_at, after))
    return [(row.updated_at, row.id) for row in connection.execute(query)]


def _family(connection: Connection, root: str) -> list[str] | None:
    """``root`` and all its descendants, or None if any descendant is not terminal."""
    family, frontier = [root], [root]
    while frontier:
        rows = connection.execute(
            select(executions.c.id, _terminal(executions).label("done"))
            .where(executions.c.parent_execution_id.in_(frontier))
            .with_for_update()
        ).all()
        if any(not row.done for row in rows):
            return None
        frontier = [row.id for row in rows]
        family.extend(frontier)
    return family


def _copy_to_archive(connection: Connection, ids: Sequence[str], now: datetime) -> None:
    for live, archive in ARCHIVES:
        key = live.c.id if live is executions else live.c.execution_id
        archive_key = archive.c.id if live is executions else archive.c.execution_id
        connection.execute(delete(archive).where(archive_key.in_(ids)))
        columns = [c.name for c in live.columns]
        selected: list[Any] = [live.c[name] for name in columns]
        if archive is executions_archive:
            columns.append("archived_at")
            selected.append(literal(to_db_time(now), archive.c.archived_at.type))
        connection.execute(
            insert(archive).from_select(columns, select(*selected).where(key.in_(ids)))
        )


def retire(
    db: Database, *, cutoff: datetime, now: datetime, archive: bool, batch: int = 200
) -> int:
    """Delete (or archive, then delete) old terminal runs; returns how many runs went,
    children included."""
    total = 0
    after = None
    while True:
        with db.transaction() as connection:
            roots = _claim_candidates(connection, cutoff, batch, after)
            families = [_family(connection, root) for _, root in roots]
            ids = [i for family in families if family is not None for i in family]
            if ids:
                if archive:
                    _copy_to_archive(connection, ids, now)
                # Steps, signals and decisions go with their run (ON DELETE CASCADE).
                connection.execute(delete(executions).where(executions.c.id.in_(ids)))
        total += len(ids)
        if len(roots) < batch:
            return total
        # Runs kept back (a child still parked) must not hide the ones behind them.
        after = roots[-1]
