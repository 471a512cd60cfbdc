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


#: The key of a saga's row that counts its runs under ``Limit(total=)`` (no key function
#: may return an empty key).
TOTAL = ""


@dataclass(frozen=True)
class RunFlow:
    """What a run's admission applies: its key, the key's limit, and the saga's total."""

    key: str
    limit: int
    total: int | None = None


def admit_run(connection: Connection, saga: str, flow: RunFlow) -> bool:
    """Take the run's slots (the saga's total first, then its key's: the order every
    admission and every ending locks them in), or none: the run is queued (False)."""
    if flow.total is None:
        return take_slot(connection, saga, flow.key, flow.limit)
    if not take_slot(connection, saga, TOTAL, flow.total):
        _ensure_row(connection, saga, flow.key, flow.limit)  # the hand-on joins on it
        return False
    if take_slot(connection, saga, flow.key, flow.limit):
        return True
    _give_back(connection, saga, TOTAL)
    return False


def _ensure_row(connection: Connection, saga: str, key: str, limit: int) -> None:
    where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == key)
    if connection.execute(select(flow_slots.c.live).where(where)).first() is not None:
        return
    try:
        with connection.begin_nested():
            values = {"saga_name": saga, "flow_key": key, "live": 0, "run_limit": limit}
            connection.execute(insert(flow_slots).values(**values))
    except IntegrityError:
        pass  # a concurrent first run of the key made it


def _give_back(connection: Connection, saga: str, key: str) -> None:
    where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == key)
    connection.execute(
        update(flow_slots).where(where, flow_slots.c.live > 0).values(live=flow_slots.c.live - 1)
    )


def release(connection: Connection, execution_id: str, now: datetime) -> list[str]:
    """The run ``execution_id``, ending in this transaction, gives its slot back: to the
    oldest queued runs of its key if any (returned; they are now running and owed their
    first message), else to the key. Under a saga's total, the freed slot goes to the run
    queued longest among the keys with a slot free (the key that waited longest). Nothing
    for a run without a key."""
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
    total_where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == TOTAL)
    total = connection.execute(select(flow_slots.c.run_limit).where(total_where)).first()
    if total is not None:
        _give_back(connection, saga, TOTAL)  # first: the order admissions lock in
    _give_back(connection, saga, key)
    if total is None:
        chosen = _hand_on_within_key(connection, saga, key)
    else:
        chosen = _hand_on_across_keys(connection, saga, total.run_limit)
    if not chosen:
        return []
    stamp = to_db_time(now)
    for run_id, run_key in chosen:
        started = connection.execute(
            update(executions)
            .where(executions.c.id == run_id, executions.c.state == _QUEUED)
            .values(
                state=ExecutionState.RUNNING.value,
                wake_at=stamp,
                updated_at=stamp,
                version=executions.c.version + 1,
            )
        ).rowcount
        assert started == 1, run_id  # locked when chosen: nothing moved it since
        why = f"a slot of key {run_key!r} freed: {execution_id} ended"
        history.note(connection, run_id, Kind.ADMITTED, now, why, data={"key": run_key})
    ids = [run_id for run_id, _ in chosen]
    logger.info("saga %r key %r: %s ended, its slot starts %s", saga, key, execution_id, ids)
    return ids


def _queued_of(saga: str) -> Any:
    return (executions.c.saga_name == saga) & (executions.c.state == _QUEUED)


def _hand_on_within_key(connection: Connection, saga: str, key: str) -> list[tuple[str, str]]:
    """The key's oldest queued runs, as many as its free slots, each given one."""
    where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == key)
    slot = connection.execute(select(flow_slots.c.live, flow_slots.c.run_limit).where(where)).one()
    free = slots_to_hand_on(slot.live, slot.run_limit, slot.run_limit)
    if free == 0:
        return []
    queued = connection.execute(
        select(executions.c.id)
        .where(_queued_of(saga), executions.c.flow_key == key)
        .order_by(executions.c.created_at, executions.c.id)
        .limit(free)
        .with_for_update()
    )
    chosen = [(r.id, key) for r in queued]
    if chosen:
        connection.execute(
            update(flow_slots).where(where).values(live=flow_slots.c.live + len(chosen))
        )
    return chosen


def _hand_on_across_keys(connection: Connection, saga: str, total: int) -> list[tuple[str, str]]:
    """Under a saga's total: while it has a slot free, the run queued longest among the
    keys with a slot of their own free (fairness: a flooded key holds at most its limit,
    and the key that waited longest goes next)."""
    chosen: list[tuple[str, str]] = []
    total_where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == TOTAL)
    live = connection.execute(select(flow_slots.c.live).where(total_where)).scalar_one()
    for _ in range(slots_to_hand_on(live, total, total)):
        slot = flow_slots.alias("slot")
        oldest = connection.execute(
            select(executions.c.id, executions.c.flow_key)
            .join(
                slot,
                (slot.c.saga_name == executions.c.saga_name)
                & (slot.c.flow_key == executions.c.flow_key),
            )
            .where(
                _queued_of(saga),
                slot.c.live < slot.c.run_limit,
                executions.c.id.not_in([run_id for run_id, _ in chosen]),
            )
            .order_by(executions.c.created_at, executions.c.id)
            .limit(1)
            .with_for_update()
        ).first()
        if oldest is None:
            break
        key_where = (flow_slots.c.saga_name == saga) & (flow_slots.c.flow_key == oldest.flow_key)
        for where in (total_where, key_where):
            connection.execute(update(flow_slots).where(where).values(live=flow_slots.c.live + 1))
        chosen.append((oldest.id, oldest.flow_key))
    return chosen


@dataclass(frozen=True)
class HandedOn:
    """A run a slot was handed to, owed its first message since then."""

    execution_id: str
    version: int
    cursor: int
    cursor_sub: int
    #: Its root span's ``traceparent`` (None: started untraced).
    trace_context: str | None = None


def list_handed_on(
    db: Database, saga: str, definition_hash: str, now: datetime, limit: int = 50
) -> list[HandedOn]:
    """Runs of ``saga`` at version ``definition_hash`` that hold a slot of their key and
    are owed a message (as ``release`` leaves a run it hands a slot to)."""
    rows = db.read(
        select(
            executions.c.id,
            executions.c.version,
            executions.c.cursor,
            executions.c.cursor_sub,
            executions.c.trace_context,
        )
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
    return [
        HandedOn(r["id"], r["version"], r["cursor"], r["cursor_sub"], r["trace_context"])
        for r in rows
    ]


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
