"""Paused steps: an operator's pause, the hold at a paused step's door, and the release.

A pause is a row of ``saga_pauses`` (one per saga and step; step '' pauses the whole saga).
The step claim's own statement refuses while one matches (``prepared.not_paused``); the
claim's refusal then holds the run here, in one transaction that first takes a share lock
on the pause row, so an ``unpause`` that deletes it either comes after (and finds the held
run's ``saga_paused_runs`` row to release) or before (and the hold is not written; the
step is claimed again). A release is one transaction that deletes that row and moves the
run from ``held`` to ``running`` only if it is still held: run again after an interruption,
it finds no row and releases nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from celery_saga.errors import InvalidStateError
from celery_saga.records import ExecutionRecord, ExecutionState, Pause, StepStatus
from celery_saga.store import history
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.forward import lock_execution
from celery_saga.store.history import Kind
from celery_saga.store.queries import bump_and_load, load_execution_row
from celery_saga.store.tables import executions, paused_runs, pauses, step_records
from celery_saga.store.tables import history as history_rows

#: The ``step_name`` of a pause of a whole saga.
WHOLE_SAGA = ""


def _pause_of(values: Mapping[Any, Any], held: int = 0) -> Pause:
    paused_at = from_db_time(values["paused_at"])
    assert paused_at is not None
    step = values["step_name"] or None
    return Pause(values["saga_name"], step, values["reason"], values["actor"], paused_at, held)


def pause(
    db: Database, saga: str, step: str | None, *, reason: str, actor: str | None, now: datetime
) -> Pause:
    """Store the pause; ``InvalidStateError`` when that step (or saga) is paused already,
    naming since when and why (nothing changed)."""
    key, actor = step or WHOLE_SAGA, actor[: history.ACTOR_WIDTH] if actor else actor
    row = {
        "saga_name": saga,
        "step_name": key,
        "reason": reason,
        "actor": actor,
        "paused_at": to_db_time(now),
    }
    try:
        with db.transaction() as connection:
            connection.execute(insert(pauses).values(**row))
    except IntegrityError:
        existing = find(db, saga, step)
        ours = (reason, actor, from_db_time(to_db_time(now)))
        if existing is not None and (existing.reason, existing.actor, existing.paused_at) == ours:
            return existing  # its reply was lost and the call retried: the row is ours
        what = _named(saga, step)
        if existing is None:  # unpaused meanwhile: the operator may pause again
            raise InvalidStateError(
                f"{what} was paused and unpaused meanwhile; try again"
            ) from None
        raise InvalidStateError(
            f"{what} is paused already (since {existing.paused_at:%Y-%m-%d %H:%M:%S} UTC, "
            f"by {existing.actor or 'an operator'}: {existing.reason})"
        ) from None
    return Pause(saga, step, reason, actor, now)


def _named(saga: str, step: str | None) -> str:
    return f"saga {saga!r}" if step is None else f"step {step!r} of saga {saga!r}"


def find(db: Database, saga: str, step: str | None) -> Pause | None:
    """The pause of exactly that step (None: the whole saga), if stored."""
    rows = db.read(
        select(pauses).where(pauses.c.saga_name == saga, pauses.c.step_name == (step or ""))
    )
    return _pause_of(rows[0]) if rows else None


def list_pauses(db: Database) -> list[Pause]:
    """Every stored pause, by saga and step, with how many runs each holds."""
    counts = {
        (row["saga_name"], row["pause_step"]): int(row["held"])
        for row in db.read(
            select(
                paused_runs.c.saga_name,
                paused_runs.c.pause_step,
                func.count().label("held"),
            )
            .join(executions, executions.c.id == paused_runs.c.execution_id)
            .where(executions.c.state == ExecutionState.HELD.value)  # a cancel moved it
            .group_by(paused_runs.c.saga_name, paused_runs.c.pause_step)
        )
    }
    rows = db.read(select(pauses).order_by(pauses.c.saga_name, pauses.c.step_name))
    return [_pause_of(row, counts.get((row["saga_name"], row["step_name"]), 0)) for row in rows]


def count_pauses(db: Database) -> int:
    """How many steps (or whole sagas) are paused."""
    rows = db.read(select(func.count().label("paused")).select_from(pauses))
    return int(rows[0]["paused"])


def _pause_holding(connection: Connection, saga: str, step: str) -> Pause | None:
    """The pause that holds ``step`` of ``saga`` (its own, else the whole saga's), its row
    share-locked till the end of the transaction (an unpause's delete waits for it)."""
    rows = (
        connection.execute(
            select(pauses)
            .where(pauses.c.saga_name == saga, pauses.c.step_name.in_([step, WHOLE_SAGA]))
            .order_by(pauses.c.step_name.desc())
            .with_for_update(read=True)
        )
        .mappings()
        .all()
    )
    return _pause_of(rows[0]) if rows else None


def hold_at_door(
    db: Database,
    execution_id: str,
    *,
    saga: str,
    step: str,
    node: int,
    sub: int,
    now: datetime,
    record: str | None = None,
) -> Pause | None:
    """Hold the run at the door of ``step`` (live at (``node``, ``sub``); ``record``: the
    name its record there has, default ``step``) for the pause that covers it: state
    ``held``, its reason ``paused: <the pause's reason>``, its ``saga_paused_runs`` row and a
    ``paused`` history row. None: no pause covers the step any more (unpaused meanwhile),
    the run is no longer live there, or another worker's claim of the step holds a live
    lease (its body runs: the run is not held under it); nothing written."""
    try:
        with db.transaction() as connection:
            found = _pause_holding(connection, saga, step)
            if found is None:
                return None
            # No wake_at: a paused door has no timeout (the hold sweep reads wake_at).
            changes = {
                "state": ExecutionState.HELD.value,
                "failure_reason": found.held_reason,
                "wake_at": None,
            }
            lock_execution(connection, execution_id, node, sub, now, **changes)
            if _claimed_live(connection, execution_id, record or step, now):
                raise Conflict(execution_id)  # the run's row locked first: no claim slips in
            connection.execute(
                insert(paused_runs).values(
                    execution_id=execution_id,
                    saga_name=saga,
                    pause_step=found.step or WHOLE_SAGA,
                    step_name=step,
                    held_at=to_db_time(now),
                )
            )
            data = {"paused_at": to_db_time(found.paused_at), "whole_saga": found.step is None}
            history.note(
                connection,
                execution_id,
                Kind.PAUSED,
                now,
                found.reason,
                step=step,
                actor=found.actor,
                data=data,
            )
            return found
    except Conflict:
        return None


def _claimed_live(connection: Connection, execution_id: str, record: str, now: datetime) -> bool:
    """The step's record is claimed under a lease that has not run out (a body runs)."""
    found = connection.execute(
        select(step_records.c.id).where(
            step_records.c.execution_id == execution_id,
            step_records.c.name == record,
            step_records.c.status == StepStatus.RUNNING.value,
            step_records.c.lease_expires_at > to_db_time(now),
        )
    ).first()
    return found is not None


def unpause(db: Database, saga: str, step: str | None) -> Pause | None:
    """Delete the pause (claims pass again from here on); the pause as it was, or None
    when it was not stored (an unpause run again releases what the first one left)."""
    key = step or WHOLE_SAGA
    with db.transaction() as connection:
        rows = (
            connection.execute(
                select(pauses)
                .where(pauses.c.saga_name == saga, pauses.c.step_name == key)
                .with_for_update()
            )
            .mappings()
            .all()
        )
        if not rows:
            return None
        connection.execute(
            delete(pauses).where(pauses.c.saga_name == saga, pauses.c.step_name == key)
        )
        return _pause_of(rows[0])


def held_by(db: Database, saga: str, step: str | None, *, limit: int) -> list[str]:
    """Runs held at the door by that pause, the earliest held first."""
    rows = db.read(
        select(paused_runs.c.execution_id)
        .where(
            paused_runs.c.saga_name == saga,
            paused_runs.c.pause_step == (step or WHOLE_SAGA),
        )
        .order_by(paused_runs.c.held_at, paused_runs.c.execution_id)
        .limit(limit)
    )
    return [row["execution_id"] for row in rows]


def release(
    db: Database, execution_id: str, *, now: datetime, actor: str | None, reason: str | None
) -> tuple[ExecutionRecord, bool] | None:
    """Release a run held at a paused step's door: its row deleted and, if it is still
    held, the run ``running`` again at the same position, with an ``unpaused`` history row;
    returns the run and True. With no row: the run and False when a release landed last
    (its reply lost, the call retried: its message is owed again), else None, as when the
    run moved meanwhile (a cancel: only the row goes)."""
    with db.transaction() as connection:
        gone = connection.execute(
            delete(paused_runs).where(paused_runs.c.execution_id == execution_id)
        )
        if gone.rowcount != 1:
            return _released_last(connection, execution_id)
        run = bump_and_load(
            connection,
            execution_id,
            executions.c.state == ExecutionState.HELD.value,
            state=ExecutionState.RUNNING.value,
            failure_reason=None,
            updated_at=to_db_time(now),
        )
        if run is None:
            return None
        history.note(connection, execution_id, Kind.UNPAUSED, now, reason, actor=actor)
        return run, True


def _released_last(
    connection: Connection, execution_id: str
) -> tuple[ExecutionRecord, bool] | None:
    """The run, if the last thing that happened to it is a release (nothing ran since)."""
    run = load_execution_row(connection, execution_id)
    if run is None or run.state is not ExecutionState.RUNNING:
        return None
    last = connection.execute(
        select(history_rows.c.kind)
        .where(history_rows.c.execution_id == execution_id)
        .order_by(history_rows.c.id.desc())
        .limit(1)
    ).scalar()
    return (run, False) if last == Kind.UNPAUSED.value else None
