"""Step flow control in the store (guarantee 37): a limited step's door.

Every door of a key first locks the key's row of ``saga_step_keys``. A step's row of
``saga_step_waits`` is its place at the door: waiting (``granted_at`` NULL), holding a slot
(granted; it counts while its record is ``running``, or for one lease after the grant while
its message is on its way), or booked for a rate's turn (``turn_at``). Nothing counts a
slot apart from these rows and the step records they name, so a crash, a lost reply or a
write that never came frees or doubles nothing: a grant whose message was lost turns back
into a waiter a lease later, and a slot whose holder died counts while its record stays
``running`` (till its run is recovered). Every door and every leave also grants the free
slots to the waiters ahead, oldest first: the rows it returns are owed their message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from celery_saga.decisions.step_flow import grant, next_turn, start_of, waits_in_place
from celery_saga.records import ExecutionState, StepStatus
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.tables import executions, step_keys, step_records, step_waits

_RUNNING = StepStatus.RUNNING.value
#: Run states in which a claimed body may still run (a cancel stops it first).
_LIVE = tuple(
    s.value
    for s in (
        ExecutionState.RUNNING,
        ExecutionState.CANCELLING,
        ExecutionState.COMPENSATING,
        ExecutionState.HELD,
    )
)
#: Waiters read past the first ones a pass grants, for the rows of ended runs it drops.
_SPARE = 8


@dataclass(frozen=True)
class StepDoor:
    """A step of a run at a limited door, as its message named it."""

    execution_id: str
    record: str
    saga: str
    version: str
    scope: str
    key: str
    node: int
    sub: int
    member: int
    attempt: int


@dataclass(frozen=True)
class SlotVerdict:
    """A door's answer: whether the step starts, and the waiters that took a slot too
    (each owed its message)."""

    go: bool
    woken: list[StepDoor]


@dataclass(frozen=True)
class Turn:
    """A rate's answer: ``go``, or the seconds after which to send the step's message for
    its booked turn ``at`` (None: a message for it is on its way already)."""

    go: bool
    countdown: float | None = None
    at: datetime | None = None
    #: A start in a moment: the seconds its body waits for it in the worker.
    sleep: float = 0.0


#: A message that comes this close before its booked turn is sent again for it; one that
#: comes earlier is not the one sent for the turn (that one waits), and is dropped.
RESEND_WITHIN = 1.0


def _key_row(scope: str, key: str) -> Any:
    return (step_keys.c.scope == scope) & (step_keys.c.flow_key == key)


def _lock_key(connection: Connection, scope: str, key: str) -> tuple[Any, Any]:
    """Lock the key's row (made by its first door): a rate's turns booked until, and its
    last start (None: none yet)."""
    where = _key_row(scope, key)
    columns = (step_keys.c.next_turn_at, step_keys.c.last_start_at)
    query = select(*columns).where(where).with_for_update()
    row = connection.execute(query).first()
    if row is None:
        try:  # a savepoint: a concurrent first door of the key may make it first
            with connection.begin_nested():
                connection.execute(insert(step_keys).values(scope=scope, flow_key=key))
        except IntegrityError:
            pass
        row = connection.execute(query).first()
    assert row is not None
    return from_db_time(row[0]), from_db_time(row[1])


def _body_runs() -> Any:
    return exists().where(
        step_records.c.execution_id == step_waits.c.execution_id,
        step_records.c.name == step_waits.c.record,
        step_records.c.status == _RUNNING,
    )


def _of(door: StepDoor) -> Any:
    return (step_waits.c.execution_id == door.execution_id) & (step_waits.c.record == door.record)


def door_of(row: Mapping[Any, Any]) -> StepDoor:
    return StepDoor(
        execution_id=row["execution_id"],
        record=row["record"],
        saga=row["saga_name"],
        version=row["definition_hash"],
        scope=row["scope"],
        key=row["flow_key"],
        node=row["node"],
        sub=row["sub"],
        member=row["member"],
        attempt=row["attempt"],
    )


def _occupied(connection: Connection, door: StepDoor, cutoff: datetime) -> int:
    """Slots of the key held by steps other than ``door``'s; rows of ended runs dropped."""
    rows = connection.execute(
        select(
            step_waits.c.execution_id,
            step_waits.c.record,
            step_waits.c.granted_at,
            executions.c.state,
            _body_runs().label("body"),
        )
        .join(executions, executions.c.id == step_waits.c.execution_id)
        .where(
            step_waits.c.scope == door.scope,
            step_waits.c.flow_key == door.key,
            step_waits.c.granted_at.is_not(None),
            ~_of(door),
        )
    ).all()
    held, ended = 0, []
    for row in rows:
        if row.state not in _LIVE:
            ended.append((row.execution_id, row.record))
        elif row.body or (row.state == ExecutionState.RUNNING.value and _since(row) > cutoff):
            held += 1
    _drop(connection, ended)
    return held


def _ahead(
    connection: Connection, door: StepDoor, mine: Any, cutoff: datetime, wanted: int
) -> list[StepDoor]:
    """Up to ``wanted`` live waiters of the key ahead of ``door`` (all of them when it has
    no row yet), oldest first: waiting, or granted a lease ago with no body (their message
    was lost); rows of ended runs dropped."""
    waiting = or_(
        step_waits.c.granted_at.is_(None),
        and_(step_waits.c.granted_at <= to_db_time(cutoff), ~_body_runs()),
    )
    query = (
        select(step_waits, executions.c.state)
        .join(executions, executions.c.id == step_waits.c.execution_id)
        .where(step_waits.c.scope == door.scope, step_waits.c.flow_key == door.key, waiting)
        .where(~_of(door), step_waits.c.turn_at.is_(None))
        .order_by(step_waits.c.waiting_since, step_waits.c.execution_id, step_waits.c.record)
        .limit(wanted + _SPARE)
    )
    if mine is not None:
        query = query.where(step_waits.c.waiting_since <= mine.waiting_since)
    found, ended = [], []
    for row in connection.execute(query).mappings().all():
        place = (row["waiting_since"], row["execution_id"], row["record"])
        if row["state"] != ExecutionState.RUNNING.value:
            ended.append(place[1:])
        elif mine is None or place < (mine.waiting_since, mine.execution_id, mine.record):
            found.append(door_of(row))
    _drop(connection, ended)
    return found[:wanted]


def _since(row: Any) -> datetime:
    """When the row's slot was granted."""
    granted = from_db_time(row.granted_at)
    assert granted is not None
    return granted


def _drop(connection: Connection, rows: list[tuple[str, str]]) -> None:
    for execution_id, record in rows:
        connection.execute(
            delete(step_waits).where(
                step_waits.c.execution_id == execution_id, step_waits.c.record == record
            )
        )


def _grant(connection: Connection, doors: list[StepDoor], now: datetime) -> None:
    for each in doors:
        connection.execute(update(step_waits).where(_of(each)).values(granted_at=to_db_time(now)))


def _mine(connection: Connection, door: StepDoor) -> Any:
    query = select(step_waits, _body_runs().label("body")).where(_of(door))
    return connection.execute(query).first()


def _place(connection: Connection, door: StepDoor, mine: Any, now: datetime, **values: Any) -> None:
    """Write ``door``'s row (its place at the door kept when it has one)."""
    if mine is not None:
        connection.execute(update(step_waits).where(_of(door)).values(**values))
        return
    connection.execute(
        insert(step_waits).values(
            execution_id=door.execution_id,
            record=door.record,
            saga_name=door.saga,
            definition_hash=door.version,
            scope=door.scope,
            flow_key=door.key,
            node=door.node,
            sub=door.sub,
            member=door.member,
            attempt=door.attempt,
            waiting_since=to_db_time(now),
            **values,
        )
    )


def enter(db: Database, door: StepDoor, limit: int, now: datetime, lease: float) -> SlotVerdict:
    """``door``'s step at its key's door: it starts with a slot (its row granted; one it
    holds already, as a takeover of its own claim, is kept), or it waits in line."""
    cutoff = now - timedelta(seconds=lease)
    with db.transaction() as connection:
        _lock_key(connection, door.scope, door.key)
        mine = _mine(connection, door)
        held = mine is not None and mine.granted_at is not None
        if held and (mine.body or _since(mine) > cutoff):
            return SlotVerdict(True, [])
        free = limit - _occupied(connection, door, cutoff)
        ahead = _ahead(connection, door, mine, cutoff, max(free, 0) + 1)
        go, woken = grant(free, ahead)
        _grant(connection, woken, now)
        _place(connection, door, mine, now, granted_at=to_db_time(now) if go else None)
        return SlotVerdict(go, woken)


def leave(db: Database, door: StepDoor, limit: int, now: datetime, lease: float) -> list[StepDoor]:
    """``door``'s step is done at its door for now (its attempt ended, or its claim was
    refused): its slot given back unless its record is still ``running`` (a worker that
    gave up its claim), and the free slots granted to the oldest waiters."""
    with db.transaction() as connection:
        _lock_key(connection, door.scope, door.key)
        connection.execute(delete(step_waits).where(_of(door), ~_body_runs()))
        return _wake(connection, door, limit, now, lease)


def wake(db: Database, door: StepDoor, limit: int, now: datetime, lease: float) -> list[StepDoor]:
    """Grant the free slots of ``door``'s key to its oldest waiters (``door`` itself among
    them): the recovery sweep's pass for a key whose wake-up was lost."""
    with db.transaction() as connection:
        _lock_key(connection, door.scope, door.key)
        return _wake(connection, door, limit, now, lease)


def _wake(
    connection: Connection, door: StepDoor, limit: int, now: datetime, lease: float
) -> list[StepDoor]:
    """Grant the free slots of ``door``'s key, counting every row of the key (``door``'s
    own too: a slot kept for a claim given up is not free)."""
    anyone = replace(door, execution_id="", record="")
    cutoff = now - timedelta(seconds=lease)
    free = limit - _occupied(connection, anyone, cutoff)
    woken = _ahead(connection, anyone, None, cutoff, max(free, 0))
    _grant(connection, woken, now)
    return woken


def take_turn(db: Database, door: StepDoor, interval: float, clock: Callable[[], datetime]) -> Turn:
    """A rate's turn for ``door``'s step: it starts now (or in a moment: ``Turn.sleep``),
    or at its booked turn. Its row keeps the booking, so its message, sent again for that
    time (or by the recovery sweep once the turn has passed), starts it then without
    booking twice; a message that comes early (the recovery sweep's, while the one sent for
    the turn waits) is dropped. Starts are a whole interval apart, late messages too: the
    time is read once the key's row is locked (``clock``), not before a wait for the lock."""
    spacing = timedelta(seconds=interval)
    with db.transaction() as connection:
        booked_until, last_start = _lock_key(connection, door.scope, door.key)
        now = clock()
        key = _key_row(door.scope, door.key)
        mine = _mine(connection, door)
        booked = mine is not None and mine.turn_at is not None
        if booked:
            turn = _turn(mine)
            if (turn - now).total_seconds() > RESEND_WITHIN:
                return Turn(False, None, turn)
        else:
            turn, booked_until = next_turn(booked_until, now, spacing)
            until = to_db_time(booked_until)
            connection.execute(update(step_keys).where(key).values(next_turn_at=until))
        start = start_of(turn, last_start, spacing)
        if waits_in_place(start, now, spacing):
            if mine is not None:
                connection.execute(delete(step_waits).where(_of(door)))
            started = to_db_time(max(start, now))
            connection.execute(update(step_keys).where(key).values(last_start_at=started))
            return Turn(True, sleep=max((start - now).total_seconds(), 0.0))
        if booked_until is None or start + spacing > booked_until:  # pushed past the turns
            after = to_db_time(start + spacing)
            connection.execute(update(step_keys).where(key).values(next_turn_at=after))
        _place(connection, door, mine, now, turn_at=to_db_time(start))
        return Turn(False, (start - now).total_seconds(), start)


def _turn(row: Any) -> datetime:
    turn = from_db_time(row.turn_at)
    assert turn is not None
    return turn
