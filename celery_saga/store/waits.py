"""Signals and waits. Each writer takes the run's row lock first, so a signal and the run
parking itself (or its deadline firing) are serialised: none of them decides on a snapshot
the other is about to change (guarantees 13-15)."""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.decisions.waits import (
    Arrival,
    SignalVerdict,
    Wake,
    decide_arrival,
    decide_signal,
    decide_wake,
)
from celery_saga.errors import (
    DuplicateSignalError,
    ExecutionNotFoundError,
    InvalidStateError,
)
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.store import drivers, history, prepared
from celery_saga.store.codec import unpack
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import (
    advance_values,
    fail_read_run,
    prefixed,
    release_if_ending,
)
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.store.queries import keyset_after
from celery_saga.store.rows import execution_from_row
from celery_saga.store.tables import executions, signals


def lock_execution(
    connection: Connection, execution_id: str, skip_locked: bool = False
) -> ExecutionRecord | None:
    """Read the run's row under its write lock (SQLite: the transaction's own lock)."""
    found = drivers.rows(connection, _run_locked(skip_locked), {"run_id": execution_id})
    return execution_from_row(found[0]) if found else None


@functools.cache
def _run_locked(skip_locked: bool) -> Any:
    run_id = bindparam("run_id", type_=executions.c.id.type)
    query = select(executions).where(executions.c.id == run_id)
    return query.with_for_update(skip_locked=skip_locked)


def _received(connection: Connection, execution_id: str, event: str) -> Any:
    found = drivers.rows(connection, _signal_received(), {"run_id": execution_id, "event": event})
    return found[0]["received_at"] if found else None


@functools.cache
def _signal_received() -> Any:
    return select(signals.c.received_at).where(
        signals.c.execution_id == bindparam("run_id", type_=signals.c.execution_id.type),
        signals.c.event == bindparam("event", type_=signals.c.event.type),
    )


def _resume(
    connection: Connection, execution_id: str, gate: int, advance: Advance, now: datetime
) -> bool:
    """Parked at ``gate`` -> running past it, or completed when the gate was the last node;
    the WHERE clause makes it the only resume."""
    # The move's own state (completed past a final gate) wins over running: see
    # tests/test_gates.py::test_a_gate_in_any_position_is_passed_by_its_signal.
    moved = {"state": ExecutionState.RUNNING.value, **advance_values(advance, now)}
    params = {"run_id": execution_id, "gate": gate, "run_updated_at": to_db_time(now)}
    statement = _resumed(tuple(sorted(moved)))
    if drivers.rowcount(connection, statement, {**params, **prefixed("set_", moved)}) != 1:
        return False
    release_if_ending(connection, advance, execution_id, now)
    return True


@functools.cache
def _resumed(keys: tuple[str, ...]) -> Any:
    """The resume (params ``run_id``, ``gate``), built once per set of moved columns."""
    parked_here = (
        (executions.c.id == prepared.param("run_id", executions.c.id))
        & (executions.c.state == ExecutionState.WAITING.value)
        & (executions.c.cursor == prepared.param("gate", executions.c.cursor))
    )
    return update(executions).where(parked_here).values(wake_at=None, **prepared.bumped_run(keys))


@functools.cache
def _moved(keys: tuple[str, ...]) -> Any:
    """The run's row (param ``run_id``, locked before) moved or parked at its gate."""
    return (
        update(executions)
        .where(executions.c.id == prepared.param("run_id", executions.c.id))
        .values(**prepared.bumped_run(keys))
    )


@functools.cache
def _insert_signal() -> Any:
    names = ("execution_id", "event", "payload", "received_at")
    return insert(signals).values({name: prepared.param(name, signals.c[name]) for name in names})


def record_signal_once(
    db: Database,
    *,
    execution_id: str,
    event: str,
    payload_blob: bytes,
    gate: int,
    advance: Advance,
    now: datetime,
    actor: str | None = None,
) -> bool:
    """Store the signal (and its ``signalled`` history row, naming ``actor``); True if it
    resumed the run (parked at ``gate``), False if it waits for the run to reach the gate.
    Refusals raise and store nothing."""
    with db.transaction() as connection:
        run = lock_execution(connection, execution_id)
        if run is None:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        received = _received(connection, execution_id, event)
        verdict = decide_signal(run, gate, received is not None)
        what = f"signal {event!r} for execution {execution_id!r} (saga {run.saga_name!r})"
        if verdict is SignalVerdict.DUPLICATE:
            raise DuplicateSignalError(
                f"{what} refused: it was already received at {received}; a signal counts once"
            )
        if verdict is SignalVerdict.NOT_ACCEPTING:
            raise InvalidStateError(
                f"{what} refused: the run is {run.state.value}; only running or waiting runs "
                "accept signals"
            )
        try:
            stored = {"event": event, "payload": payload_blob, "received_at": to_db_time(now)}
            drivers.rowcount(connection, _insert_signal(), {"execution_id": execution_id, **stored})
        except IntegrityError:
            raise DuplicateSignalError(f"{what} refused: it was already received") from None
        resumed = verdict is SignalVerdict.RESUME and _resume(
            connection, execution_id, gate, advance, now
        )
        detail = f"{event!r}: " + ("the run resumed" if resumed else "before the run waits")
        data = {"event": event, "resumed": resumed}
        entry = HistoryEntry(now, Kind.SIGNALLED.value, actor=actor, detail=detail, data=data)
        history.write(connection, execution_id, entry)
        return resumed


def park_for_signal(
    db: Database,
    *,
    execution_id: str,
    gate: int,
    event: str,
    definition_hash: str,
    wake_at: datetime | None,
    advance: Advance,
    now: datetime,
) -> Arrival:
    """The run reached ``gate``: park it with its deadline (``wait-entered``), unless the
    signal is already there, in which case it moves on at once (past its last node, with its
    ``run-completed`` row). REFUSE: not the run's position any more."""
    with db.transaction() as connection:
        run = lock_execution(connection, execution_id)
        present = run is not None and _received(connection, execution_id, event) is not None
        arrival = decide_arrival(run, gate, definition_hash, present)
        stamp = to_db_time(now)
        if arrival is Arrival.PASS:
            values = advance_values(advance, now)
        elif arrival is Arrival.PARK:
            deadline = None if wake_at is None else to_db_time(wake_at)
            values = {"state": ExecutionState.WAITING.value, "wake_at": deadline}
        else:
            return arrival
        params = {"run_id": execution_id, "run_updated_at": stamp, **prefixed("set_", values)}
        drivers.rowcount(connection, _moved(tuple(sorted(values))), params)
        if arrival is Arrival.PASS and advance.finished:
            # no step ends the run: its signal, stored before, did (guarantee 33)
            why = f"{event!r}: its signal was stored when the run reached its last gate"
            history.note(connection, execution_id, Kind.RUN_COMPLETED, now, why)
            release_if_ending(connection, advance, execution_id, now)
        if arrival is Arrival.PARK:
            until = None if wake_at is None else wake_at.isoformat()
            detail = f"for {event!r} " + (f"until {until}" if until else "(no deadline)")
            data = {"event": event, "until": until}
            entry = HistoryEntry(now, Kind.WAIT_ENTERED.value, detail=detail, data=data)
            history.write(connection, execution_id, entry)
        return arrival


@dataclass(frozen=True)
class ExpiredWait:
    id: str
    saga_name: str
    definition_hash: str
    cursor: int
    wake_at: datetime
    #: The run's stored trace (``celery_saga.tracing``), if traced.
    trace_context: str | None = None


_EXPIRED_COLUMNS = ("id", "saga_name", "definition_hash", "cursor", "wake_at", "trace_context")


def list_expired_waits(
    db: Database, *, now: datetime, limit: int, after: tuple[datetime, str] | None = None
) -> list[ExpiredWait]:
    """Parked runs whose deadline has passed (inclusive), by deadline, one page after
    ``after`` (a (wake_at, id) the previous page ended on)."""
    query = (
        select(*(executions.c[c] for c in _EXPIRED_COLUMNS))
        .where(
            executions.c.state == ExecutionState.WAITING.value,
            executions.c.wake_at <= to_db_time(now),
        )
        .order_by(executions.c.wake_at, executions.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(keyset_after(executions.c.wake_at, after))
    return [
        ExpiredWait(
            r["id"],
            r["saga_name"],
            r["definition_hash"],
            r["cursor"],
            r["wake_at"],
            r["trace_context"],
        )
        for r in db.read(query)
    ]


@dataclass(frozen=True)
class WakeResult:
    wake: Wake
    unwind: UnwindStep | None = None


def expire_wait(
    db: Database,
    *,
    execution_id: str,
    event: str,
    reason: str,
    advance: Advance,
    compensations: Collection[str],
    now: datetime,
) -> WakeResult:
    """Fire one expired deadline. The row is claimed with SKIP LOCKED where the database
    has it, so two sweepers (two beat processes) never fire the same wait twice; the signal
    is re-checked under the lock before the run is failed (``wait-timed-out``), and a run
    whose signal is there moves on (``wait-resumed``)."""
    with db.transaction() as connection:
        run = lock_execution(connection, execution_id, skip_locked=True)
        if run is None:
            return WakeResult(Wake.NOTHING)
        present = _received(connection, execution_id, event) is not None
        wake = decide_wake(run, present, now)
        if wake is Wake.RESUME:
            _resume(connection, execution_id, run.cursor, advance, now)
            # its ``signalled`` row, written before, did not resume the run: this row does
            detail = f"{event!r}: its signal was stored already; the timer sweep moved the run on"
            data = {"event": event}
            history.note(connection, execution_id, Kind.WAIT_RESUMED, now, detail, data=data)
            return WakeResult(wake)
        if wake is Wake.NOTHING:
            return WakeResult(wake)
        connection.execute(
            update(executions)
            .where(executions.c.id == execution_id)
            .values(version=executions.c.version + 1)
        )
        plan = fail_read_run(connection, run, reason, compensations, now)
        entry = HistoryEntry(now, Kind.WAIT_TIMED_OUT.value, detail=reason)
        history.write(connection, execution_id, entry)
        return WakeResult(wake, plan)


def load_signals(db: Database, execution_id: str) -> dict[str, Any]:
    """Event -> payload of every signal the run received (None for a payload-less one)."""
    rows = db.read(
        select(signals.c.event, signals.c.payload).where(signals.c.execution_id == execution_id)
    )
    return {row["event"]: unpack(row["payload"]) for row in rows}
