"""Reads for operators: listing live or archived runs with filters, one run with everything
that happened to it, and counts for ``stats``. Nothing here writes, and every read goes to
the store's read replica when it has one (``replica.reads``)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, func, or_, select

from celery_saga.errors import SagaError
from celery_saga.limits import EXECUTION_ID_LENGTH, NAME_LENGTH, storable_cursor_id, text_problem
from celery_saga.records import ExecutionRecord, ExecutionState, RollbackStatus, StepRecord
from celery_saga.store import history
from celery_saga.store import labels as run_labels
from celery_saga.store.codec import unpack_or_sealed
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.history import HistoryEntry
from celery_saga.store.queries import Page, decode_cursor
from celery_saga.store.replica import reads
from celery_saga.store.rows import execution_from_row, step_from_row
from celery_saga.store.tables import (
    executions,
    executions_archive,
    signals,
    signals_archive,
    step_records,
    step_records_archive,
)


@dataclass(frozen=True)
class Filters:
    """What ``list`` narrows to; empty sequences and None mean "any"."""

    saga_names: Sequence[str] = ()
    states: Sequence[ExecutionState] = ()
    rollback_statuses: Sequence[RollbackStatus] = ()
    created_before: datetime | None = None  # inclusive
    created_after: datetime | None = None  # inclusive
    definition_hashes: Sequence[str] = ()  # runs on these versions


@dataclass(frozen=True)
class Signal:
    event: str
    payload: Any
    received_at: datetime


@dataclass(frozen=True)
class StoredRun:
    """One run as stored: its row, steps in start order, signals, and where it lives."""

    record: ExecutionRecord
    steps: tuple[StepRecord, ...]
    signals: tuple[Signal, ...]
    archived_at: datetime | None = None
    history: tuple[HistoryEntry, ...] = ()
    #: Its labels (``start(..., labels=...)``), by key.
    labels: tuple[tuple[str, str], ...] = ()


def _tables(archived: bool) -> tuple[Table, Table, Table]:
    if archived:
        return executions_archive, step_records_archive, signals_archive
    return executions, step_records, signals


def _encode(record: ExecutionRecord) -> str:
    # The same form as ``SagaEngine.list`` hands out, so a cursor reads the same anywhere.
    raw = f"{to_db_time(record.created_at).isoformat()}|{record.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def list_runs(
    db: Database,
    filters: Filters,
    *,
    archived: bool,
    limit: int,
    cursor: str | None,
    newest_first: bool = False,
) -> Page:
    """One page of runs, oldest first (``newest_first``: the other way; a cursor continues
    in the order that handed it out). Raises ``ValueError`` for a foreign cursor and
    ``SagaError`` for a saga name no run can have (a driver would refuse it: a NUL)."""
    for name in filters.saga_names:
        problem = text_problem(name, NAME_LENGTH, "saga_executions.saga_name")
        if problem is not None:
            raise SagaError(f"the saga name {name!r:.100} {problem}")
    table, db = _tables(archived)[0], reads(db)
    # Either way an index on (..., created_at, id) is read in its order, forwards or
    # backwards, and stops after the page (tests/test_history_sweeps.py checks the plans).
    at, run_id = table.c.created_at, table.c.id
    order = (at.desc(), run_id.desc()) if newest_first else (at, run_id)
    query = select(table).order_by(*order).limit(limit + 1)
    if filters.saga_names:
        query = query.where(table.c.saga_name.in_(list(filters.saga_names)))
    if filters.states:
        query = query.where(table.c.state.in_([s.value for s in filters.states]))
    if filters.definition_hashes:
        query = query.where(table.c.definition_hash.in_(list(filters.definition_hashes)))
    if filters.rollback_statuses:
        statuses = [s.value for s in filters.rollback_statuses]
        query = query.where(table.c.rollback_status.in_(statuses))
    if filters.created_before is not None:
        query = query.where(table.c.created_at <= to_db_time(filters.created_before))
    if filters.created_after is not None:
        query = query.where(table.c.created_at >= to_db_time(filters.created_after))
    if cursor is not None:
        stamp, last_id = decode_cursor(cursor)
        query = query.where(_after(table, (stamp, storable_cursor_id(last_id)), newest_first))
    rows = db.read(query)
    items = tuple(execution_from_row(r, unpack_or_sealed) for r in rows[:limit])
    more = len(rows) > limit
    return Page(items, _encode(items[-1]) if more and items else None)


def _after(table: Table, last: tuple[datetime, str], newest_first: bool) -> Any:
    """Rows past ``last`` in the listing's order: as ``queries.keyset_after``, for either
    table and either direction; the first comparison is what the index seeks to."""
    stamp, last_id = last
    at, run_id = table.c.created_at, table.c.id
    if newest_first:
        return and_(at <= stamp, or_(at < stamp, and_(at == stamp, run_id < last_id)))
    return and_(at >= stamp, or_(at > stamp, and_(at == stamp, run_id > last_id)))


def load_run(db: Database, execution_id: str, *, fresh: bool = False) -> StoredRun | None:
    """The run from the live tables, else from the archive, else None (at once for an id
    no run can have: PostgreSQL refuses a NUL with a driver error). ``fresh``: from the
    store itself even when it has a replica, for the verb about to act on the run."""
    if text_problem(execution_id, EXECUTION_ID_LENGTH) is not None:
        return None
    db = db if fresh else reads(db)
    for archived in (False, True):
        run_table, step_table, signal_table = _tables(archived)
        rows = db.read(select(run_table).where(run_table.c.id == execution_id))
        if not rows:
            continue
        steps = db.read(
            select(step_table)
            .where(step_table.c.execution_id == execution_id)
            .order_by(step_table.c.id)
        )
        received = db.read(
            select(signal_table)
            .where(signal_table.c.execution_id == execution_id)
            .order_by(signal_table.c.received_at, signal_table.c.event)
        )
        signal_rows = tuple(
            Signal(r["event"], unpack_or_sealed(r["payload"]), _aware(r["received_at"]))
            for r in received
        )
        return StoredRun(
            execution_from_row(rows[0], unpack_or_sealed),
            tuple(step_from_row(r, opener=unpack_or_sealed) for r in steps),
            signal_rows,
            from_db_time(rows[0]["archived_at"]) if archived else None,
            tuple(history.load(db, execution_id, archived)),
            tuple(run_labels.load(db, [execution_id], archived).get(execution_id, {}).items()),
        )
    return None


def _aware(value: datetime) -> datetime:
    stamp = from_db_time(value)
    assert stamp is not None
    return stamp


@dataclass(frozen=True)
class Stats:
    #: (saga name, state) -> number of runs; unfinished states only unless ``complete``
    counts: dict[tuple[str, str], int]
    #: runs in the archive tables, counted only when ``complete``
    archived: int | None
    oldest_waiting: ExecutionRecord | None
    oldest_parked: ExecutionRecord | None
    complete: bool = False


#: What ``stats`` counts by default: the runs that are live or need an operator. Their index
#: range is small whatever the history; counting finished runs reads all of them.
UNFINISHED = tuple(s.value for s in ExecutionState if not s.is_terminal)


def run_counts(db: Database, *, complete: bool = False) -> dict[tuple[str, str], int]:
    """(saga, state) -> runs, unfinished ones only unless ``complete`` (see ``stats``)."""
    query = select(executions.c.saga_name, executions.c.state, func.count().label("runs"))
    if not complete:
        query = query.where(executions.c.state.in_(UNFINISHED))
    grouped = reads(db).read(query.group_by(executions.c.saga_name, executions.c.state))
    return {(r["saga_name"], r["state"]): int(r["runs"]) for r in grouped}


def oldest_unfinished_by_saga(
    db: Database, states: Sequence[str] = UNFINISHED
) -> dict[str, datetime]:
    """Each saga's oldest unfinished run's creation time (of a run in one of ``states``),
    read from the unfinished runs only (the index on state): the cost follows what is
    live, not the history."""
    rows = reads(db).read(
        select(executions.c.saga_name, func.min(executions.c.created_at).label("oldest"))
        .where(executions.c.state.in_(states))
        .group_by(executions.c.saga_name)
    )
    found = {r["saga_name"]: from_db_time(r["oldest"]) for r in rows}
    return {saga: oldest for saga, oldest in found.items() if oldest is not None}


def longest_held_by_saga(db: Database) -> dict[str, datetime]:
    """Since when each saga's longest held run has been held: a held run's row changes only
    when it is moved, so its ``updated_at`` is when it was held. Read from the held runs
    only (the index on state)."""
    rows = reads(db).read(
        select(executions.c.saga_name, func.min(executions.c.updated_at).label("since"))
        .where(executions.c.state == ExecutionState.HELD.value)
        .group_by(executions.c.saga_name)
    )
    found = {r["saga_name"]: from_db_time(r["since"]) for r in rows}
    return {saga: since for saga, since in found.items() if since is not None}


def _oldest(db: Database, state: ExecutionState) -> ExecutionRecord | None:
    """The run in ``state`` started first: one seek in the index on (state, created_at, id),
    where the longest unchanged would sort every run in that state (updated_at is in no
    index, migration 0003)."""
    rows = reads(db).read(
        select(executions)
        .where(executions.c.state == state.value)
        .order_by(executions.c.created_at, executions.c.id)
        .limit(1)
    )
    return execution_from_row(rows[0]) if rows else None


def stats(db: Database, *, complete: bool = False) -> Stats:
    """Counts of unfinished runs by saga and state, from the index on state (guarantee 32);
    ``complete`` counts finished and archived runs too, which reads the whole history."""
    archived = None
    if complete:
        counted = reads(db).read(select(func.count().label("runs")).select_from(executions_archive))
        archived = int(counted[0]["runs"])
    return Stats(
        counts=run_counts(db, complete=complete),
        archived=archived,
        oldest_waiting=_oldest(db, ExecutionState.WAITING),
        oldest_parked=_oldest(db, ExecutionState.COMPENSATION_STUCK),
        complete=complete,
    )
