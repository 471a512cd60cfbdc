"""Creating executions and reading them back: snapshots, listing, journaled decisions."""

from __future__ import annotations

import base64
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, exists, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased

from celery_saga.records import ExecutionRecord, ExecutionState, RollbackStatus, StepRecord
from celery_saga.store import drivers, history, prepared
from celery_saga.store import flow as store_flow
from celery_saga.store import labels as run_labels
from celery_saga.store.codec import pack, unpack, unpack_or_sealed
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.rows import execution_from_row, step_from_row
from celery_saga.store.tables import decisions, executions, step_records

_STEP_PREFIX = "step__"


def create_execution(
    db: Database,
    *,
    execution_id: str,
    saga_name: str,
    definition_hash: str,
    input_blob: bytes,
    node: int,
    sub: int,
    state: ExecutionState,
    committed: bool,
    now: datetime,
    parent_execution_id: str | None = None,
    deadline_at: datetime | None = None,
    labels: Mapping[str, str] | None = None,
    flow: store_flow.RunFlow | None = None,
    trace_context: str | None = None,
) -> ExecutionState:
    """A plain INSERT, with the run's ``started`` history row: a duplicate id fails loudly
    instead of overwriting a live run. ``labels`` (checked): one more INSERT in the same
    transaction; none without them. ``flow``: the run's key and its limit; without a free
    slot the run is stored ``queued``. Returns the state stored."""
    stamp = to_db_time(now)
    values = {
        "id": execution_id,
        "saga_name": saga_name,
        "definition_hash": definition_hash,
        "state": state.value,
        "cursor": node,
        "cursor_sub": sub,
        "input": input_blob,
        "committed_at": stamp if committed else None,
        "parent_execution_id": parent_execution_id,
        "created_at": stamp,
        "updated_at": stamp,
        "version": 1,
        "deadline_at": None if deadline_at is None else to_db_time(deadline_at),
        "members_settled": 0,
        "members_failed": 0,
        "flow_key": None,
        "trace_context": trace_context,
    }
    if flow is not None:
        return _create_limited(db, values, now, flow, labels)
    if db.dialect == "postgresql" and not labels:
        with db.single_statement() as connection:
            drivers.rowcount(connection, prepared.new_run_started(), values)
        return state
    with db.transaction() as connection:  # two INSERTs in one (three with labels)
        _insert_run(db, connection, values, now, labels)
    return state


def _insert_run(
    db: Database,
    connection: Connection,
    values: dict[str, Any],
    now: datetime,
    labels: Mapping[str, str] | None,
) -> None:
    """The run's row and its ``started`` history row (one statement on PostgreSQL), and
    its labels."""
    if db.dialect == "postgresql":
        drivers.rowcount(connection, prepared.new_run_started(), values)
    else:
        drivers.rowcount(connection, prepared.new_run(), values)
        history.write(connection, values["id"], HistoryEntry(now, Kind.STARTED.value))
    if labels:
        run_labels.write(connection, values["id"], labels)


def _create_limited(
    db: Database,
    values: dict[str, Any],
    now: datetime,
    flow: store_flow.RunFlow,
    labels: Mapping[str, str] | None,
) -> ExecutionState:
    """``create_execution`` of a run under a flow-control limit: its slot is taken, or the
    run queued, in the transaction that stores it (an INSERT that fails gives the slot
    back): one statement more than a run without a limit when a slot is free."""
    key, run_id = flow.key, values["id"]
    with db.transaction() as connection:
        admitted = store_flow.admit_run(connection, values["saga_name"], flow)
        state = ExecutionState(values["state"]) if admitted else ExecutionState.QUEUED
        row = {**values, "state": state.value, "flow_key": key}
        _insert_run(db, connection, row, now, labels)
        if not admitted:
            why = f"key {key!r} (limit {flow.limit}, saga total {flow.total}) has no slot free"
            history.note(connection, run_id, Kind.QUEUED, now, why, data={"key": key})
    return state


def snapshot_query(run_id: Any) -> Any:
    """The execution row joined with all its step records, steps in start order."""
    step_columns = [c.label(_STEP_PREFIX + c.name) for c in step_records.c]
    return (
        select(executions, *step_columns)
        .select_from(
            executions.outerjoin(step_records, step_records.c.execution_id == executions.c.id)
        )
        .where(executions.c.id == run_id)
        .order_by(step_records.c.id)
    )


def snapshot_from_rows(
    rows: Sequence[Mapping[Any, Any]],
) -> tuple[ExecutionRecord | None, list[StepRecord]]:
    if not rows:
        return None, []
    steps = [step_from_row(r, _STEP_PREFIX) for r in rows if r[_STEP_PREFIX + "id"] is not None]
    return execution_from_row(rows[0]), steps


def load_snapshot(
    db: Database, execution_id: str
) -> tuple[ExecutionRecord | None, list[StepRecord]]:
    """The execution row and all its step records, in one statement."""
    return snapshot_from_rows(db.read(_snapshot_by_id(), {"run_id": execution_id}))


@functools.cache
def _snapshot_by_id() -> Any:
    return snapshot_query(bindparam("run_id", type_=executions.c.id.type))


def load_run_with_step(
    db: Database, execution_id: str, name: str | None
) -> tuple[ExecutionRecord | None, list[StepRecord]]:
    """The execution row and its step record ``name`` (if any), in one statement: what
    admission needs at a position whose record is known, whatever the run's other steps
    (guarantee 32: an item of a ``for_each`` reads the same rows at its 1,000th as at its
    first). ``name`` None: the run with all its steps (``load_snapshot``)."""
    if name is None:
        return load_snapshot(db, execution_id)
    return snapshot_from_rows(db.read(_run_with_step(), {"run_id": execution_id, "name": name}))


@functools.cache
def _run_with_step() -> Any:
    step_columns = [c.label(_STEP_PREFIX + c.name) for c in step_records.c]
    on = and_(
        step_records.c.execution_id == executions.c.id,
        step_records.c.name == bindparam("name", type_=step_records.c.name.type),
    )
    return (
        select(executions, *step_columns)
        .select_from(executions.outerjoin(step_records, on))
        .where(executions.c.id == bindparam("run_id", type_=executions.c.id.type))
    )


def load_steps(connection: Connection, execution_id: str) -> list[StepRecord]:
    rows = drivers.rows(connection, prepared.steps_of_run(), {"run_id": execution_id})
    return [step_from_row(r) for r in rows]


def load_step(db: Database, execution_id: str, name: str) -> StepRecord | None:
    """One step record, in one read (to learn whether a write whose reply was lost landed)."""
    rows = db.read(
        select(step_records).where(
            step_records.c.execution_id == execution_id, step_records.c.name == name
        )
    )
    return step_from_row(rows[0]) if rows else None


def load_execution(db: Database, execution_id: str) -> ExecutionRecord | None:
    """The execution row alone, in one read."""
    rows = db.read(prepared.run_by_id(), {"run_id": execution_id})
    return execution_from_row(rows[0]) if rows else None


def load_execution_row(connection: Connection, execution_id: str) -> ExecutionRecord | None:
    rows = drivers.rows(connection, prepared.run_by_id(), {"run_id": execution_id})
    return execution_from_row(rows[0]) if rows else None


def bump_run(connection: Connection, execution_id: str, *where: Any, **values: Any) -> bool:
    """Write ``values`` to the run, and a new row version, if it matches ``where`` (its row
    is locked till the end of the transaction); False: it does not (any more)."""
    result = connection.execute(
        update(executions)
        .where(executions.c.id == execution_id, *where)
        .values(version=executions.c.version + 1, **values)
    )
    return bool(result.rowcount == 1)


def bump_and_load(
    connection: Connection, execution_id: str, *where: Any, **values: Any
) -> ExecutionRecord | None:
    """``bump_run``, then the run as it now stands; None: it did not match ``where``."""
    if not bump_run(connection, execution_id, *where, **values):
        return None
    return load_execution_row(connection, execution_id)


def journal_decision(
    db: Database, execution_id: str, key: str, value: Any, now: datetime, what: str = ""
) -> Any:
    """First writer wins: the value already journaled under ``key`` is returned if any."""
    blob = pack(value, what=what or f"decision {key!r}")
    try:
        with db.single_statement() as connection:
            connection.execute(
                insert(decisions).values(
                    execution_id=execution_id,
                    key=key,
                    value=blob,
                    created_at=to_db_time(now),
                )
            )
        return value
    except IntegrityError:
        existing = load_decision(db, execution_id, key)
        if existing is None:
            raise
        return existing[0]


def load_decision(db: Database, execution_id: str, key: str) -> tuple[Any] | None:
    rows = db.read(
        select(decisions.c.value).where(
            decisions.c.execution_id == execution_id, decisions.c.key == key
        )
    )
    return (unpack(rows[0]["value"]),) if rows else None


@dataclass(frozen=True)
class Page:
    """One page of executions, oldest first; pass ``next_cursor`` to get the next page."""

    items: tuple[ExecutionRecord, ...]
    next_cursor: str | None


def _encode_cursor(record: ExecutionRecord) -> str:
    raw = f"{to_db_time(record.created_at).isoformat()}|{record.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


_parent = aliased(executions)


def top_level() -> Any:
    """Runs that are nobody's child: no parent, or a parent whose row is gone. One NOT
    EXISTS covers both (a NULL parent matches no row), which PostgreSQL runs as an anti-join
    probing the primary key; OR-ed with ``parent IS NULL`` it hashed every run id instead."""
    return ~exists().where(_parent.c.id == executions.c.parent_execution_id)


def keyset_after(time_column: Any, after: tuple[datetime, str]) -> Any:
    """Rows strictly after ``after`` in (time_column, id) order: keyset pagination. The
    ``>=`` is what an index on the time column seeks to; an OR alone would be a filter, and a
    page would read every row before it (the rows earlier batches of retention deleted)."""
    stamp, last_id = after
    return and_(
        time_column >= stamp,
        or_(time_column > stamp, and_(time_column == stamp, executions.c.id > last_id)),
    )


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ``ValueError`` for anything ``list_executions`` did not hand out."""
    stamp, _, execution_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
    if not execution_id:
        raise ValueError(cursor)
    return datetime.fromisoformat(stamp), execution_id


def list_executions(
    db: Database,
    *,
    saga_names: Sequence[str] = (),
    states: Sequence[ExecutionState] = (),
    rollback_statuses: Sequence[RollbackStatus] = (),
    after: tuple[datetime, str] | None = None,
    limit: int,
) -> Page:
    query = select(executions).order_by(executions.c.created_at, executions.c.id).limit(limit + 1)
    if saga_names:
        query = query.where(executions.c.saga_name.in_(list(saga_names)))
    if states:
        query = query.where(executions.c.state.in_([s.value for s in states]))
    if rollback_statuses:
        query = query.where(executions.c.rollback_status.in_([s.value for s in rollback_statuses]))
    if after is not None:
        query = query.where(keyset_after(executions.c.created_at, after))
    rows = db.read(query)
    items = tuple(execution_from_row(r, unpack_or_sealed) for r in rows[:limit])
    more = len(rows) > limit
    return Page(items, _encode_cursor(items[-1]) if more and items else None)
