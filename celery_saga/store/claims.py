"""A claimed attempt's lease in either direction: renewed, given up, released, taken over.

Each function is written once over a direction's columns (``directions``): the forward
step's claim and its reversal's differ in columns and history kinds only. The direction is
the attempt's own (``Attempt.direction``).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, update

from celery_saga.records import Attempt, StepRecord
from celery_saga.store import attempts, drivers, history
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.directions import Columns, columns, held, held_params, held_values
from celery_saga.store.tables import step_records


class Conflict(Exception):
    """A conditional write matched nothing: another worker got there first. Rolls back."""


def renew(db: Database, attempt: Attempt, *, lease_expires_at: datetime) -> bool:
    """Extend the lease of a record ``attempt`` still holds (the heartbeat's write)."""
    with db.single_statement() as connection:
        return _lease_until(connection, attempt, lease_expires_at)


def give_up(db: Database, attempt: Attempt, *, now: datetime, why: str) -> bool:
    """End the lease of a record ``attempt`` still holds, keeping the attempt counted: its
    worker is shutting down (or its run is being cancelled), so the next message may claim
    it at once (guarantee 27). ``why`` goes to the attempt's history row."""
    direction = columns(attempt.direction)
    with db.transaction() as connection:
        if not _lease_until(connection, attempt, now):
            return False
        attempts.write_row(
            connection, attempt, direction.released, now, why, reversal=direction.reversal
        )
        return True


def _lease_until(connection: Connection, attempt: Attempt, until: datetime) -> bool:
    """Set the lease of the record ``attempt`` still holds; False: it holds it no more."""
    direction = columns(attempt.direction)
    result = connection.execute(
        update(step_records)
        .where(held(direction, attempt))
        .values({direction.lease: to_db_time(until)})
    )
    return bool(result.rowcount == 1)


@functools.cache
def settle_held(direction: Columns, changes: tuple[str, ...]) -> Any:
    """Settle the record this attempt holds, clearing its lease; built once per shape.
    Params: ``direction.params`` and ``set_<column>`` for each of ``changes``."""
    values = {key: bindparam(f"set_{key}", type_=step_records.c[key].type) for key in changes}
    return (
        update(step_records)
        .where(held_params(direction))
        .values({direction.lease.key: None, **values})
    )


def settle(connection: Connection, attempt: Attempt, **changes: Any) -> None:
    """Settle the record ``attempt`` holds (its lease cleared) or conflict."""
    direction = columns(attempt.direction)
    params = {**held_values(direction, attempt), **{f"set_{k}": v for k, v in changes.items()}}
    statement = settle_held(direction, tuple(sorted(changes)))
    if drivers.rowcount(connection, statement, params) != 1:
        raise Conflict(attempt.execution_id)


def release(db: Database, attempt: Attempt, *, reason: str, now: datetime) -> bool:
    """An attempt failed but more are allowed: free the claim for the next one, its reason
    kept, with the attempt's history row."""
    direction = columns(attempt.direction)
    changes: dict[str, Any] = {direction.reason.key: reason}
    if direction.pending is not None:
        changes[direction.status.key] = direction.pending
    try:
        with db.transaction() as connection:
            settle(connection, attempt, **changes)
            attempts.write_row(
                connection, attempt, direction.retrying, now, reason, reversal=direction.reversal
            )
        return True
    except Conflict:
        return False


def taken_over(
    direction: Columns,
    connection: Connection,
    execution_id: str,
    attempt: int,
    *,
    lost: StepRecord | None,
    restored: history.HistoryEntry | None,
    now: datetime,
) -> None:
    """The history rows of a claim of attempt ``attempt`` just taken: ``lost``, the record
    as read before, whose attempt held it under a lease and never settled (unless it gave
    its claim up, its row says it was taken over); ``restored``, the row of a claim its
    live holder writes back after the store lost it."""
    if lost is not None:
        kinds = (direction.lost, direction.released)
        history.write_lost_row(connection, lost, kinds, direction.held_of(lost), now)
    if restored is not None:
        history.write(connection, execution_id, replace(restored, attempt=attempt))
