"""The lines at limited steps' doors, read (guarantee 37): what ``saga show``, ``celery saga
limits``, the gauges and the recovery sweep see of ``store/step_flow.py``'s rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, or_, select

from celery_saga.records import DoorPlace, ExecutionState, KeyLoad
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.step_flow import StepDoor, door_of
from celery_saga.store.tables import executions, step_waits


@dataclass(frozen=True)
class Place:
    """A step's row at its door: granted a slot, or booked for ``turn_at``, or waiting."""

    door: StepDoor
    granted: bool
    turn_at: datetime | None


def places_of(db: Database, execution_id: str) -> list[Place]:
    """The run's places at limited doors."""
    rows = db.read(
        select(step_waits)
        .where(step_waits.c.execution_id == execution_id)
        .order_by(step_waits.c.record)
    )
    return [
        Place(door_of(r), r["granted_at"] is not None, from_db_time(r["turn_at"])) for r in rows
    ]


def door_places(db: Database, execution_id: str) -> list[DoorPlace]:
    """The run's steps waiting at a limited door (for a slot, or a booked turn)."""
    return [
        DoorPlace(p.door.record, p.door.key, p.turn_at)
        for p in places_of(db, execution_id)
        if not p.granted
    ]


def stale_lines(db: Database, cutoff: datetime, limit: int) -> list[StepDoor]:
    """The oldest waiter of each key whose line has not moved since ``cutoff`` (its
    oldest waiter waits since then): for the recovery sweep's pass of the key's free
    slots, in case the pass that should have granted them was lost."""
    since = func.min(step_waits.c.waiting_since).label("since")
    oldest = (
        select(step_waits.c.scope, step_waits.c.flow_key, since)
        .where(step_waits.c.granted_at.is_(None), step_waits.c.turn_at.is_(None))
        .group_by(step_waits.c.scope, step_waits.c.flow_key)
        .having(since <= to_db_time(cutoff))
        .limit(limit)
    )
    found: list[StepDoor] = []
    for line in db.read(oldest):
        first = db.read(
            select(step_waits)
            .where(
                step_waits.c.scope == line["scope"],
                step_waits.c.flow_key == line["flow_key"],
                step_waits.c.waiting_since == line["since"],
                step_waits.c.granted_at.is_(None),
            )
            .limit(1)
        )
        found.extend(door_of(row) for row in first)
    return found


def waits_at_its_door(cutoff: datetime) -> Any:
    """Whether the run (the row of ``saga_executions`` of the enclosing query) waits at a
    limited step's door of its position, as it should: in a key's line, or booked for a
    turn after ``cutoff`` (a turn long past lost its message). The recovery sweep leaves
    such runs to the door, in its query: however many wait, they hide no run behind them
    from the sweep's pages. One lookup of the waits' primary key per run read."""
    in_line = step_waits.c.granted_at.is_(None) & step_waits.c.turn_at.is_(None)
    placed = exists().where(
        step_waits.c.execution_id == executions.c.id,
        step_waits.c.node == executions.c.cursor,
        or_(in_line, step_waits.c.turn_at > to_db_time(cutoff)),
    )
    return and_(executions.c.state == ExecutionState.RUNNING.value, placed)


def busiest_lines(db: Database, most: int) -> list[tuple[KeyLoad, tuple[str, str, str]]]:
    """The ``most`` step keys with the most steps waiting at their door, then the most
    slots granted; each with one of its rows' (saga, version, record), whose step names
    the key's limit."""
    waits = step_waits.c
    waiting = func.count() - func.count(waits.granted_at)
    rows = db.read(
        select(
            waits.scope,
            waits.flow_key,
            func.count(waits.granted_at).label("held"),
            waiting.label("waiting"),
            func.min(waits.waiting_since).label("oldest"),
            func.min(waits.saga_name).label("saga"),
            func.min(waits.definition_hash).label("version"),
            func.min(waits.record).label("record"),
        )
        .group_by(waits.scope, waits.flow_key)
        .order_by(waiting.desc(), func.count(waits.granted_at).desc())
        .limit(most)
    )
    return [
        (
            KeyLoad(
                r["scope"],
                r["flow_key"],
                int(r["held"]),
                0,
                int(r["waiting"]),
                from_db_time(r["oldest"]) if r["waiting"] else None,
                kind="step",
            ),
            (r["saga"], r["version"], r["record"]),
        )
        for r in rows
    ]


def lines_by_saga(db: Database) -> dict[str, tuple[int, datetime]]:
    """Per saga: its steps waiting at a limited step's door, and since when the longest
    of them waits (the metrics exporter's gauges)."""
    waits = step_waits.c
    rows = db.read(
        select(
            waits.saga_name,
            func.count().label("waiting"),
            func.min(waits.waiting_since).label("since"),
        )
        .where(waits.granted_at.is_(None))
        .group_by(waits.saga_name)
    )
    out = {}
    for row in rows:
        since = from_db_time(row["since"])
        assert since is not None
        out[row["saga_name"]] = (int(row["waiting"]), since)
    return out
