"""Bulk operations as stored: one row per operation (its move, filter, who asked and why,
how far it got), and the question a resumed operation asks before it acts on a run: did
this operation act on it already? Every move writes a history row naming its actor in the
move's own transaction; a bulk operation's actor names the operation (``marked_actor``),
so that row is the proof, whether the process that wrote it lived to count it or not.
One process at a time carries an operation out: the one whose ``holder`` it stores, and
every write of its progress is conditional on that (``decisions.bulk_lease``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from celery_saga.errors import SagaError
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.history import ACTOR_WIDTH
from celery_saga.store.tables import bulk_operations, history

_MARK = " (bulk {})"


@dataclass(frozen=True)
class BulkOperation:
    """One stored operation; ``cursor`` None: not started, or finished (``finished_at``)."""

    id: str
    move: str
    filter: str
    options: Mapping[str, Any]
    actor: str | None
    reason: str | None
    cursor: str | None
    acted: int
    refused: int
    created_at: datetime
    finished_at: datetime | None
    #: The process carrying it out (``decisions.bulk_lease.Holder``), and until when.
    holder: str | None = None
    lease_until: datetime | None = None


def marked_actor(actor: str | None, operation_id: str) -> str:
    """The actor recorded in the history of every run ``operation_id`` acts on: who asked,
    and the operation (cut to the column's width, the operation's id kept whole)."""
    mark = _MARK.format(operation_id)
    return (actor or "bulk")[: ACTOR_WIDTH - len(mark)] + mark


def create(db: Database, operation: BulkOperation) -> None:
    until = operation.lease_until
    with db.transaction() as connection:
        connection.execute(
            insert(bulk_operations).values(
                id=operation.id,
                move=operation.move,
                filter=operation.filter,
                options=json.dumps(dict(operation.options)),
                actor=operation.actor,
                reason=operation.reason,
                cursor=None,
                acted=0,
                refused=0,
                created_at=to_db_time(operation.created_at),
                updated_at=to_db_time(operation.created_at),
                holder=operation.holder,
                lease_until=None if until is None else to_db_time(until),
            )
        )


def advance(
    db: Database,
    operation_id: str,
    holder: str,
    *,
    cursor: str | None,
    acted: int,
    refused: int,
    now: datetime,
    finished: bool,
) -> bool:
    """Record how far the operation got (after a page, every run of it dealt with); a
    finished operation is held by no one. False: ``holder`` no longer holds it (nothing
    written)."""
    values: dict[str, Any] = {"cursor": cursor, "acted": acted, "refused": refused}
    values["updated_at"] = to_db_time(now)
    if finished:
        values.update(finished_at=to_db_time(now), holder=None, lease_until=None)
    with db.transaction() as connection:
        return bool(connection.execute(_held_by(operation_id, holder).values(values)).rowcount)


def _held_by(operation_id: str, holder: str) -> Any:
    where = (bulk_operations.c.id == operation_id) & (bulk_operations.c.holder == holder)
    return update(bulk_operations).where(where)


def take(db: Database, operation_id: str, seen: str | None, holder: str, until: datetime) -> bool:
    """Hold the operation as ``holder`` until ``until``, if its holder is still ``seen``
    (the one the decision was taken on): of two processes taking it at once, one does. A
    take tried again after its reply was lost finds it held by ``holder`` already."""
    column = bulk_operations.c.holder
    seen_now = column.is_(None) if seen is None else column == seen
    statement = (
        update(bulk_operations)
        .where(bulk_operations.c.id == operation_id, seen_now | (column == holder))
        .values(holder=holder, lease_until=to_db_time(until))
    )
    with db.transaction() as connection:
        return bool(connection.execute(statement).rowcount)


def renew(db: Database, operation_id: str, holder: str, until: datetime) -> bool:
    """Hold on until ``until``; False: another process took the operation over."""
    with db.transaction() as connection:
        statement = _held_by(operation_id, holder).values(lease_until=to_db_time(until))
        return bool(connection.execute(statement).rowcount)


def let_go(db: Database, operation_id: str, holder: str) -> None:
    """Give the operation up (stopped on an error): another process may resume it now."""
    with db.transaction() as connection:
        connection.execute(_held_by(operation_id, holder).values(holder=None, lease_until=None))


def load(db: Database, operation_id: str) -> BulkOperation:
    rows = db.read(select(bulk_operations).where(bulk_operations.c.id == operation_id))
    if not rows:
        raise SagaError(f"no bulk operation with id {operation_id!r:.80}")
    row = rows[0]
    return BulkOperation(
        id=row["id"],
        move=row["move"],
        filter=row["filter"],
        options=json.loads(row["options"] or "{}"),
        actor=row["actor"],
        reason=row["reason"],
        cursor=row["cursor"],
        acted=row["acted"],
        refused=row["refused"],
        created_at=from_db_time(row["created_at"]) or datetime.min,
        finished_at=from_db_time(row["finished_at"]),
        holder=row["holder"],
        lease_until=from_db_time(row["lease_until"]),
    )


def acted_on(
    db: Database, execution_ids: Iterable[str], operation_id: str, actor: str | None
) -> set[str]:
    """Which of ``execution_ids`` have a history row written by ``operation_id``."""
    ids = list(execution_ids)
    if not ids:
        return set()
    query = (
        select(history.c.execution_id)
        .where(
            history.c.execution_id.in_(ids), history.c.actor == marked_actor(actor, operation_id)
        )
        .distinct()
    )
    return {row["execution_id"] for row in db.read(query)}
