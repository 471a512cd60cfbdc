"""Versions in the store: where each one is deployed, how many live runs each still has,
which runs wait for a worker that has their version, and moving a run to another version
(guarantee 22). One transaction per function."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, and_, delete, func, insert, or_, select, update

from celery_saga.records import ExecutionState
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.history import Kind
from celery_saga.store.queries import bump_run
from celery_saga.store.tables import executions, history, version_waits, versions

#: States of a run that is not over: it may still need its version's code.
LIVE_STATES = tuple(
    s.value
    for s in (
        ExecutionState.RUNNING,
        ExecutionState.WAITING,
        ExecutionState.HELD,
        ExecutionState.COMPENSATING,
        ExecutionState.COMPENSATION_STUCK,
    )
)


#: Also not over: a cancelled run whose bodies in flight are being stopped, before its
#: unwind, and a run queued by its saga's flow-control limit; their version's code is still
#: needed (not states ``upgrade`` moves a run in).
UNFINISHED_STATES = (
    *LIVE_STATES,
    ExecutionState.CANCELLING.value,
    ExecutionState.QUEUED.value,
)


@dataclass(frozen=True)
class UnfinishedRun:
    """A run that is not over, where it stands: the node index it has reached (``cursor``)."""

    execution_id: str
    saga_name: str
    definition_hash: str
    state: str
    cursor: int


@dataclass(frozen=True)
class SeenVersion:
    saga_name: str
    definition_hash: str
    label: str | None
    seen_by: str
    first_seen: datetime
    last_seen: datetime


@dataclass(frozen=True)
class VersionWait:
    """A run handed back by a worker without its version, not moved since."""

    execution_id: str
    definition_hash: str
    handed_back_by: str
    handed_back_at: datetime
    times: int


def _live(states: Sequence[str] = LIVE_STATES) -> Any:
    return or_(
        executions.c.state.in_(states),
        (executions.c.state == ExecutionState.FAILED.value)
        & executions.c.rollback_status.is_(None),
    )


def unfinished_runs_outside(db: Database, hashes: Collection[str]) -> list[UnfinishedRun]:
    """Every run that is not over whose version is none of ``hashes``. Reads the unfinished
    runs only, never the history: by ``state`` (``ix_saga_executions_state_created``) and the
    owed unwinds' partial index (``ix_saga_executions_unwind_owed``), as the recovery
    sweep; sorted here, since an ORDER BY could tempt the planner into a whole index."""
    query = select(
        executions.c.id,
        executions.c.saga_name,
        executions.c.definition_hash,
        executions.c.state,
        executions.c.cursor,
    ).where(_live(UNFINISHED_STATES))
    if hashes:
        query = query.where(executions.c.definition_hash.not_in(sorted(hashes)))
    found = [
        UnfinishedRun(r["id"], r["saga_name"], r["definition_hash"], r["state"], int(r["cursor"]))
        for r in db.read(query, serial=True)
    ]
    return sorted(found, key=lambda r: (r.saga_name, r.definition_hash, r.execution_id))


def record_seen(
    db: Database, registered: Iterable[tuple[str, str, str | None]], *, seen_by: str, now: datetime
) -> None:
    """A process with these (saga, hash, label) versions started: upsert one row each."""
    stamp = to_db_time(now)
    with db.transaction() as connection:
        for saga_name, definition_hash, label in registered:
            _upsert(
                connection,
                versions,
                {"saga_name": saga_name, "definition_hash": definition_hash, "seen_by": seen_by},
                {"last_seen": stamp, "label": label},
                new={"first_seen": stamp},
            )


def _upsert(
    connection: Connection,
    table: Table,
    key: dict[str, Any],
    values: dict[str, Any],
    *,
    new: dict[str, Any],
    again: dict[str, Any] | None = None,
) -> None:
    """Write ``values`` (and ``again``) to the row of ``table`` whose columns are ``key``;
    where there is none yet, insert it with ``values`` and ``new``."""
    where = and_(*(table.c[column] == value for column, value in key.items()))
    touched = connection.execute(update(table).where(where).values(**values, **(again or {})))
    if not touched.rowcount:
        connection.execute(insert(table).values(**key, **values, **new))


def list_seen(db: Database) -> list[SeenVersion]:
    query = select(versions).order_by(
        versions.c.saga_name, versions.c.first_seen, versions.c.definition_hash, versions.c.seen_by
    )
    return [
        SeenVersion(
            r["saga_name"],
            r["definition_hash"],
            r["label"],
            r["seen_by"],
            _time(r["first_seen"]),
            _time(r["last_seen"]),
        )
        for r in db.read(query)
    ]


def _time(value: datetime) -> datetime:
    """A NOT NULL timestamp column's value, as the rest of the store hands it out."""
    stamp = from_db_time(value)
    assert stamp is not None
    return stamp


def live_runs(db: Database) -> dict[tuple[str, str], int]:
    """How many runs that are not over each (saga, hash) has."""
    query = (
        select(executions.c.saga_name, executions.c.definition_hash, func.count())
        .where(_live(UNFINISHED_STATES))
        .group_by(executions.c.saga_name, executions.c.definition_hash)
    )
    return {(r["saga_name"], r["definition_hash"]): int(r["count_1"]) for r in db.read(query)}


def mark_waiting(
    db: Database, *, execution_id: str, definition_hash: str, handed_back_by: str, now: datetime
) -> bool:
    """Record that ``handed_back_by`` handed back a message of the run (lacking its
    version). Nothing of the run itself changes. False: this store does not hold the run."""
    stamp = to_db_time(now)
    with db.transaction() as connection:
        exists = connection.execute(
            select(executions.c.id).where(executions.c.id == execution_id)
        ).first()
        if exists is None:
            return False
        _upsert(
            connection,
            version_waits,
            {"execution_id": execution_id},
            {
                "definition_hash": definition_hash,
                "handed_back_by": handed_back_by,
                "handed_back_at": stamp,
            },
            again={"times": version_waits.c.times + 1},
            new={"times": 1},
        )
    return True


def waiting_for_version(db: Database, execution_ids: Sequence[str]) -> dict[str, VersionWait]:
    """The runs among ``execution_ids`` that wait for a worker with their version: handed
    back, and not moved since (a run that moved was taken by a worker that has it)."""
    if not execution_ids:
        return {}
    query = (
        select(version_waits)
        .join(executions, executions.c.id == version_waits.c.execution_id)
        .where(
            version_waits.c.execution_id.in_(list(execution_ids)),
            version_waits.c.handed_back_at >= executions.c.updated_at,
            version_waits.c.definition_hash == executions.c.definition_hash,
            _live(),
        )
    )
    found = {}
    for r in db.read(query):
        found[r["execution_id"]] = VersionWait(
            r["execution_id"],
            r["definition_hash"],
            r["handed_back_by"],
            _time(r["handed_back_at"]),
            int(r["times"]),
        )
    return found


def move_to_version(
    db: Database,
    *,
    execution_id: str,
    seen_version: int,
    from_hash: str,
    to_hash: str,
    actor: str,
    now: datetime,
) -> bool:
    """Rebind a run to ``to_hash`` if it is still as the operator's check saw it (same row
    version, same hash, not over); recorded in its history. False: it moved meanwhile."""
    stamp = to_db_time(now)
    with db.transaction() as connection:
        moved = bump_run(
            connection,
            execution_id,
            executions.c.version == seen_version,
            executions.c.definition_hash == from_hash,
            _live(),
            definition_hash=to_hash,
            updated_at=stamp,
        )
        if not moved:
            return False
        connection.execute(
            insert(history).values(
                execution_id=execution_id,
                at=stamp,
                kind=Kind.UPGRADED.value,
                actor=actor,
                detail=f"version {from_hash} -> {to_hash}",
            )
        )
        connection.execute(
            delete(version_waits).where(version_waits.c.execution_id == execution_id)
        )
    return True
