"""Cleanup and archive of old terminal executions (guarantee 23).

Only terminal runs whose retention has passed (cutoff inclusive) are touched, together with
their child runs, and only when every one of those children is terminal too: a parked or
waiting run is never removed. Candidates are claimed with ``FOR UPDATE SKIP LOCKED`` where
the database has it, so two beat processes split the work instead of colliding.

An archived run takes an ``archived`` history row with it, written in the transaction that
moves it; a deleted run's history is deleted with it (nothing of the run is kept).

Each batch costs the same whatever the backlog (guarantee 32): candidates are read in the
order of the index on (state, created_at, id), one terminal state after the other, from
where the previous batch stopped, so no batch reads or sorts the backlog behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, literal, or_, select
from sqlalchemy.exc import IntegrityError

from celery_saga.records import ExecutionState, RollbackStatus
from celery_saga.store import history
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.queries import keyset_after, top_level
from celery_saga.store.tables import ARCHIVES, executions, executions_archive

logger = logging.getLogger("celery_saga.retention")

#: A progress line every this many batches of a long catch-up.
LOG_EVERY = 50

#: After a batch that retired runs, a catch-up rests this many times the batch's duration,
#: so it holds a core a third of the time at most. Flat out on 2 cores (6,000-8,000 runs/s)
#: it raised the p95 of live five-step runs 1.3-1.9x; resting 3x, 1.0x at about 2,000 runs/s.
#: See docs/scaling.md.
REST = 2.0


def _terminal(table: Any) -> Any:
    """Completed, cancelled, or failed with its unwind finished (a failed run still owed
    its unwind is recovered, not retired)."""
    return or_(
        table.c.state.in_((ExecutionState.COMPLETED.value, ExecutionState.CANCELLED.value)),
        and_(table.c.state == ExecutionState.FAILED.value, table.c.rollback_status.is_not(None)),
    )


#: The terminal runs, one index range each, with an equality on every column before
#: created_at: completed runs in the index on (state, created_at, id), failed ones per
#: rollback status in the one on (rollback_status, created_at, id). A batch is then an
#: ordered scan of its own rows, where an OR or a range of statuses would be sorted whole.
_RANGES = (
    (executions.c.state == ExecutionState.COMPLETED.value,),
    (executions.c.state == ExecutionState.CANCELLED.value,),
    *(
        (
            executions.c.rollback_status == status.value,
            executions.c.state == ExecutionState.FAILED.value,
        )
        for status in RollbackStatus
    ),
)


@dataclass(frozen=True)
class Position:
    """Where a catch-up stands: the range it reads and the last (created_at, id) claimed."""

    range_index: int = 0
    after: tuple[datetime, str] | None = None


def _claim_candidates(
    connection: Connection, cutoff: datetime, limit: int, position: Position
) -> list[tuple[datetime, str]]:
    """(created_at, id) of top-level (or orphaned) terminal runs of one range not updated
    since ``cutoff``, after ``position`` in index order, locked for this transaction."""
    stamp = to_db_time(cutoff)
    query = (
        select(executions.c.created_at, executions.c.id)
        .where(
            *_RANGES[position.range_index],
            # A run is updated after it is created: the index bounds the range by created_at,
            # updated_at (in no index, migration 0003) filters the rows inside it.
            executions.c.created_at <= stamp,
            executions.c.updated_at <= stamp,
            top_level(),
        )
        .order_by(executions.c.created_at, executions.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    if position.after is not None:
        query = query.where(keyset_after(executions.c.created_at, position.after))
    return [(row.created_at, row.id) for row in connection.execute(query)]


#: MySQL plans an IN list of this many values or more (``eq_range_index_dive_limit``, 200 by
#: default) from index statistics. On parent_execution_id, NULL in nearly every run, those
#: make each value look like half the table: it read the whole index, 1.9 s a batch at 1M runs.
_MYSQL_IN_LIST = 100


def _children(connection: Connection, parents: Sequence[str]) -> list[Any]:
    """(id, parent, terminal) of the children of ``parents``, locked; one statement for all
    of them, or one per ``_MYSQL_IN_LIST`` on MySQL."""
    mysql = connection.dialect.name in ("mysql", "mariadb")
    size = _MYSQL_IN_LIST if mysql else max(len(parents), 1)
    rows: list[Any] = []
    for start in range(0, len(parents), size):
        rows += connection.execute(
            select(executions.c.id, executions.c.parent_execution_id, _terminal(executions))
            .where(executions.c.parent_execution_id.in_(parents[start : start + size]))
            .with_for_update()
        ).all()
    return rows


def _families(connection: Connection, roots: Sequence[str]) -> list[str]:
    """``roots`` and all their descendants, less every family that holds a run that is not
    terminal; one statement per generation for the whole batch."""
    root_of = {root: root for root in roots}
    held: set[str] = set()
    frontier = list(roots)
    while frontier:
        rows = _children(connection, frontier)
        frontier = []
        for child, parent, done in rows:
            root_of[child] = root_of[parent]
            frontier.append(child)
            if not done:
                held.add(root_of[parent])
    return [run for run, root in root_of.items() if root not in held]


def _copy_to_archive(
    connection: Connection, ids: Sequence[str], now: datetime, replace: bool
) -> None:
    """Copy the runs' rows into the archive. Only ``replace`` (an id archived before: the
    first try hit the archive's primary key) deletes from the archive first: a DELETE there
    is planned from the archive's statistics, which a growing archive rarely has fresh."""
    for live, archive in ARCHIVES:
        key = live.c.id if live is executions else live.c.execution_id
        if replace:
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


def retire_batch(
    db: Database,
    *,
    cutoff: datetime,
    now: datetime,
    archive: bool,
    batch: int,
    position: Position,
    actor: str | None = None,
) -> tuple[int, Position | None]:
    """One bounded transaction: retire up to ``batch`` families from ``position`` on (an
    archived run takes an ``archived`` history row naming ``actor`` with it). Returns how
    many runs went and where the next batch starts (None: nothing left)."""
    args = (db, cutoff, now, archive, batch, position)
    try:
        roots, ids = _retire_once(*args, replace=False, actor=actor)
    except IntegrityError:
        if not archive:
            raise
        # A run id archived before: the batch again, replacing the older copies.
        roots, ids = _retire_once(*args, replace=True, actor=actor)
    if len(roots) == batch:
        # Runs kept back (a child still parked) must not hide the ones behind them.
        return len(ids), Position(position.range_index, roots[-1])
    if position.range_index + 1 < len(_RANGES):
        return len(ids), Position(position.range_index + 1)
    return len(ids), None


def _retire_once(
    db: Database,
    cutoff: datetime,
    now: datetime,
    archive: bool,
    batch: int,
    position: Position,
    replace: bool,
    actor: str | None = None,
) -> tuple[list[tuple[datetime, str]], list[str]]:
    with db.transaction() as connection:
        roots = _claim_candidates(connection, cutoff, batch, position)
        ids = _families(connection, [root for _, root in roots])
        if ids:
            if archive:
                _copy_to_archive(connection, ids, now, replace)
                # after the copy (a replace deletes older copies first), before the delete
                # (each row is numbered after its run's last live one); one statement a batch
                history.write_archived(connection, ids, now, actor, archived_because(cutoff))
            # Steps, signals and decisions go with their run (ON DELETE CASCADE).
            connection.execute(delete(executions).where(executions.c.id.in_(ids)))
    return roots, ids


def retire(
    db: Database,
    *,
    cutoff: datetime,
    now: datetime,
    archive: bool,
    batch: int = 500,
    budget: float | None = None,
    rest: float = REST,
    actor: str | None = None,
) -> int:
    """Delete (or archive, then delete) old terminal runs; returns how many runs went,
    children included. With ``budget`` (seconds) it stops after the batch that passes it,
    and the next call carries on: a backlog never holds one worker for hours. After each
    batch that retired runs it sleeps ``rest`` times that batch's duration (``REST``).
    ``actor``: who archives (named in each archived run's ``archived`` history row)."""
    total, batches, began = 0, 0, time.monotonic()
    position: Position | None = Position()
    while position is not None:
        started = time.monotonic()
        gone, position = retire_batch(
            db,
            cutoff=cutoff,
            now=now,
            archive=archive,
            batch=batch,
            position=position,
            actor=actor,
        )
        if gone and rest > 0:
            time.sleep((time.monotonic() - started) * rest)
        total, batches = total + gone, batches + 1
        elapsed = time.monotonic() - began
        if batches % LOG_EVERY == 0:
            rate = total / max(elapsed, 1e-9)
            logger.info("retention: %d run(s) %s so far (%.0f/s)", total, _verb(archive), rate)
        # a batch that found nothing (an empty range) moves on without spending the budget
        if budget is not None and elapsed >= budget and position is not None and gone:
            logger.info("retention: %d run(s) %s; the rest next time", total, _verb(archive))
            break
    return total


def archived_because(cutoff: datetime) -> str:
    """Why a run was archived, as its ``archived`` history row says."""
    return f"ended, and not updated since {cutoff.isoformat()}"


def _verb(archive: bool) -> str:
    return "archived" if archive else "deleted"
