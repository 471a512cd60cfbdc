"""Flow control in the store (guarantee 37): a key's slots are a row, ``saga_flow_slots``,
whose ``live`` count every admission and every ending changes under its row lock.

``admit`` takes a slot in the transaction that stores a new run (one UPDATE when a slot is
free). ``release`` runs in the transaction that ends a run holding a slot: it gives the slot
back, or hands it to the key's oldest queued runs, which become ``running`` and marked as
owed their first message (``wake_at``), so a crash right after the commit leaves them to
the timer sweep (``recovery.list_owed``) instead of losing them. Nothing polls.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from celery_saga.decisions.flow import FlowVerdict, admit, slots_to_hand_on
from celery_saga.records import ExecutionState, KeyLoad, QueuePlace
from celery_saga.store import history
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.history import Kind
from celery_saga.store.tables import executions, flow_slots

logger = logging.getLogger("celery_saga")

_QUEUED = ExecutionState.QUEUED.value


def _of_key() -> Any:
    return (flow_slots.c.saga_name == bindparam("saga")) & (
        flow_slots.c.flow_key == bindparam("key")
    )


@functools.cache
def _take_free_slot() -> Any:
    return (
        update(flow_slots)
        .where(_of_key(), flow_slots.c.live < bindparam("run_limit"))
        .values(live=flow_slots.c.live + 1, run_limit=bindparam("run_limit"))
    )


def take_slot(connection: Connection, saga: str, key: str, limit: int) -> bool:
    """Take a slot of ``key`` for a run being stored (True), or none is free: the run is
    queued (False), decided under the key row's lock, so a run ending meanwhile either
    sees this run queued or freed its slot before this decision."""
    params = {"saga": saga, "key": key, "run_limit": limit}
    if connection.execute(_take_free_slot(), params).rowcount == 1:
        return True  # the usual case: one statement
    where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == key)
    if connection.execute(select(flow_slots.c.live).where(where)).first() is None:
        try:  # the key's first run; a savepoint, as a concurrent first run may win
            with connection.begin_nested():
                values = {"saga_name": saga, "flow_key": key, "live": 1, "run_limit": limit}
                connection.execute(insert(flow_slots).values(**values))
            return True
        except IntegrityError:
            pass
    live = connection.execute(select(flow_slots.c.live).where(where).with_for_update()).scalar()
    verdict = admit(int(live or 0), limit)
    values = {"run_limit": limit}
    if verdict is FlowVerdict.ADMIT:
        values["live"] = flow_slots.c.live + 1
    connection.execute(update(flow_slots).where(where).values(**values))
    return verdict is FlowVerdict.ADMIT


def release(connection: Connection, execution_id: str, now: datetime) -> list[str]:
    """The run ``execution_id``, ending in this transaction, gives its slot back: to the
    oldest queued runs of its key if any (returned; they are now running and owed their
    first message), else to the key. Nothing for a run without a key."""
    row = connection.execute(
        select(executions.c.saga_name, executions.c.flow_key).where(executions.c.id == execution_id)
    ).first()
    if row is None or row.flow_key is None:
        return []
    saga, key = row.saga_name, row.flow_key
    # Its key goes with its slot: a run reopened later (a child its parent unwinds) and
    # ending again gives nothing back twice.
    connection.execute(
        update(executions).where(executions.c.id == execution_id).values(flow_key=None)
    )
    where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == key)
    connection.execute(
        update(flow_slots).where(where, flow_slots.c.live > 0).values(live=flow_slots.c.live - 1)
    )
    slot = connection.execute(select(flow_slots.c.live, flow_slots.c.run_limit).where(where)).one()
    free = slots_to_hand_on(slot.live, slot.run_limit, slot.run_limit)
    if free == 0:
        return []
    queued = connection.execute(
        select(executions.c.id)
        .where(
            executions.c.saga_name == saga,
            executions.c.flow_key == key,
            executions.c.state == _QUEUED,
        )
        .order_by(executions.c.created_at, executions.c.id)
        .limit(free)
        .with_for_update()
    )
    chosen = [r.id for r in queued]
    if not chosen:
        return []
    stamp = to_db_time(now)
    started = connection.execute(
        update(executions)
        .where(executions.c.id.in_(chosen), executions.c.state == _QUEUED)
        .values(
            state=ExecutionState.RUNNING.value,
            wake_at=stamp,
            updated_at=stamp,
            version=executions.c.version + 1,
        )
    ).rowcount
    assert started == len(chosen), (started, chosen)  # locked above: none moved since
    connection.execute(update(flow_slots).where(where).values(live=flow_slots.c.live + len(chosen)))
    why = f"a slot of key {key!r} freed: {execution_id} ended"
    for run_id in chosen:
        history.note(connection, run_id, Kind.ADMITTED, now, why, data={"key": key})
    logger.info("saga %r key %r: %s ended, its slot starts %s", saga, key, execution_id, chosen)
    return chosen


@dataclass(frozen=True)
class HandedOn:
    """A run a slot was handed to, owed its first message since then."""

    execution_id: str
    version: int
    cursor: int
    cursor_sub: int


def list_handed_on(
    db: Database, saga: str, definition_hash: str, now: datetime, limit: int = 50
) -> list[HandedOn]:
    """Runs of ``saga`` at version ``definition_hash`` that hold a slot of their key and
    are owed a message (as ``release`` leaves a run it hands a slot to)."""
    rows = db.read(
        select(executions.c.id, executions.c.version, executions.c.cursor, executions.c.cursor_sub)
        .where(
            executions.c.state == ExecutionState.RUNNING.value,
            executions.c.wake_at <= to_db_time(now),
            executions.c.saga_name == saga,
            executions.c.definition_hash == definition_hash,
            executions.c.flow_key.is_not(None),
        )
        .order_by(executions.c.wake_at, executions.c.id)
        .limit(limit)
    )
    return [HandedOn(r["id"], r["version"], r["cursor"], r["cursor_sub"]) for r in rows]


def queue_place(db: Database, execution_id: str) -> QueuePlace | None:
    """Where the queued run ``execution_id`` stands; None if it is not queued."""
    run = db.read(
        select(executions.c.saga_name, executions.c.flow_key, executions.c.created_at).where(
            executions.c.id == execution_id, executions.c.state == _QUEUED
        )
    )
    if not run or run[0]["flow_key"] is None:
        return None
    saga, key, created = run[0]["saga_name"], run[0]["flow_key"], run[0]["created_at"]
    ahead = db.read(
        select(func.count().label("ahead"))
        .select_from(executions)
        .where(
            executions.c.saga_name == saga,
            executions.c.flow_key == key,
            executions.c.state == _QUEUED,
            (executions.c.created_at < created)
            | ((executions.c.created_at == created) & (executions.c.id < execution_id)),
        )
    )
    return QueuePlace(key, int(ahead[0]["ahead"]))


def busiest_keys(db: Database, most: int = 20) -> list[KeyLoad]:
    """The ``most`` keys with the most runs queued, then live: the keys with a run queued
    (from the queued runs only, the index on state) and the fullest slot rows."""
    queued = db.read(
        select(
            executions.c.saga_name,
            executions.c.flow_key,
            func.count().label("queued"),
            func.min(executions.c.created_at).label("oldest"),
        )
        .where(executions.c.state == _QUEUED)
        .group_by(executions.c.saga_name, executions.c.flow_key)
        .order_by(func.count().desc())
        .limit(most)
    )
    waiting = {(r["saga_name"], r["flow_key"]): r for r in queued}
    fullest = db.read(
        select(flow_slots)
        .where(flow_slots.c.live > 0)
        .order_by(flow_slots.c.live.desc())
        .limit(most)
    )
    slots = {(r["saga_name"], r["flow_key"]): r for r in fullest}
    for saga, key in set(waiting) - set(slots):
        rows = db.read(
            select(flow_slots).where(flow_slots.c.saga_name == saga, flow_slots.c.flow_key == key)
        )
        if rows:
            slots[saga, key] = rows[0]
    loads = []
    for (saga, key), slot in slots.items():
        queue = waiting.get((saga, key))
        loads.append(
            KeyLoad(
                saga,
                key,
                int(slot["live"]),
                int(slot["run_limit"]),
                int(queue["queued"]) if queue else 0,
                from_db_time(queue["oldest"]) if queue else None,
            )
        )
    loads.sort(key=lambda k: (-k.queued, -k.live, k.saga, k.key))
    return loads[:most]
