"""A run's history: append-only rows of what happened to it, kept and archived with it.

Each row is written in the transaction of the transition it records (``write``), so a
transition and its row are stored together or not at all. Plain SQL reads them:
``SELECT at, kind, step, actor, detail FROM saga_history WHERE execution_id = ? ORDER BY id``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, literal, select

from celery_saga.records import RollbackStatus, StepRecord
from celery_saga.store import drivers
from celery_saga.store.codec import pack, unpack_or_sealed
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.tables import executions, history, history_archive

#: The width of the ``actor`` column.
ACTOR_WIDTH = 200


class Kind(str, Enum):
    """What a row records; the value is what ``saga_history.kind`` stores."""

    STARTED = "started"
    WAIT_ENTERED = "wait-entered"
    SIGNALLED = "signalled"
    WAIT_TIMED_OUT = "wait-timed-out"
    PARKED = "parked"
    RESUMED = "resumed"
    ABANDONED = "abandoned"
    #: A parked reversal recorded as done by hand (``detail``: the operator's note).
    RESOLVED = "resolved"
    CANCELLED = "cancelled"
    RECOVERED = "recovered"
    UPGRADED = "upgraded"
    #: A body's outcome that arrived after its claim had been taken over.
    LATE_OUTCOME = "late-outcome"
    #: A claim the store lost (a server crash, a failover), written back by its live holder.
    CLAIM_RESTORED = "claim-restored"
    #: How a step attempt ended (one row per attempt, written with its outcome).
    STEP_COMPLETED = "step-completed"
    STEP_FAILED = "step-failed"
    STEP_RETRYING = "step-retrying"
    #: Its claim was taken over (its worker died, or its body outlived the lease).
    STEP_LOST = "step-lost"
    #: Its worker gave the claim up (a shutdown, a cancel): the attempt counts, no outcome.
    STEP_RELEASED = "step-released"
    #: How a reversal attempt ended (one row per attempt, as for a step's).
    REVERSAL_COMPLETED = "reversal-completed"
    REVERSAL_FAILED = "reversal-failed"
    REVERSAL_SKIPPED = "reversal-skipped"
    REVERSAL_RETRYING = "reversal-retrying"
    REVERSAL_LOST = "reversal-lost"
    REVERSAL_RELEASED = "reversal-released"
    #: A run completed at a node where nothing ran (a loop that ended, no item left, a last
    #: gate whose signal was there): no step attempt's row ends it.
    RUN_COMPLETED = "run-completed"
    #: A run failed for a reason no step raised: a choice that could not be made, a value
    #: that could not be stored, a changed definition (the reason is the run's).
    RUN_FAILED = "run-failed"
    #: An unwind begun on no step's account: a completed child reopened by its parent's
    #: unwind, a failed run taken up by the recovery sweep, a cancelled run once its bodies
    #: stopped.
    UNWIND_BEGUN = "unwind-begun"
    #: An unwind closed on no reversal's account: nothing (more) was owed a reversal.
    UNWIND_CLOSED = "unwind-closed"
    #: A parallel group joined late, when a settled member's message came again.
    GROUP_JOINED = "group-joined"
    #: A waiting run moved on by the timer sweep, which found its signal already stored.
    WAIT_RESUMED = "wait-resumed"
    #: A step with ``on_failure="hold"`` failed for good: the run is held (``detail``: the
    #: error; ``data``: attempts and the hold's timeout).
    HELD = "held"
    #: An operator's move on a held run (``actor``, ``detail``: the reason given).
    HOLD_RETRIED = "hold-retried"
    HOLD_SKIPPED = "hold-skipped"
    HOLD_UNWOUND = "hold-unwound"
    #: The run reached a paused step and is held at its door (``detail``: the pause's
    #: reason, ``actor``: who paused it); ``unpaused``: an unpause released it.
    PAUSED = "paused"
    UNPAUSED = "unpaused"
    #: The run moved to the archive tables (``saga cleanup --archive``, ``engine.archive``).
    ARCHIVED = "archived"
    #: Stored beyond its key's flow-control limit: it waits for a slot (guarantee 37).
    QUEUED = "queued"
    #: A queued run handed a slot by a run of its key that ended.
    ADMITTED = "admitted"


#: The kinds a reversal attempt's end writes.
REVERSAL_KINDS = frozenset(
    k.value
    for k in (
        Kind.REVERSAL_COMPLETED,
        Kind.REVERSAL_FAILED,
        Kind.REVERSAL_SKIPPED,
        Kind.REVERSAL_RETRYING,
        Kind.REVERSAL_LOST,
        Kind.REVERSAL_RELEASED,
    )
)

#: The kinds a step attempt's end writes.
ATTEMPT_KINDS = frozenset(
    k.value
    for k in (
        Kind.STEP_COMPLETED,
        Kind.STEP_FAILED,
        Kind.STEP_RETRYING,
        Kind.STEP_LOST,
        Kind.STEP_RELEASED,
    )
)


@dataclass(frozen=True)
class HistoryEntry:
    """One row: ``kind`` says what happened (a ``Kind`` value), ``actor`` who made it happen
    (an operator; None for the engine itself), ``data`` holds a value it carried."""

    at: datetime
    kind: str
    step: str | None = None
    attempt: int | None = None
    holder: str | None = None
    actor: str | None = None
    detail: str | None = None
    data: Any = None
    #: The row's id (set when read back): increasing in the order rows were written.
    id: int | None = None
    #: A step attempt's start (its end is ``at``).
    started_at: datetime | None = None


def claim_restored(
    step: str, holder: str | None, at: datetime, reversal: bool = False
) -> HistoryEntry:
    """The row of a claim its live holder wrote back after the store lost it (guarantee 30);
    the caller sets its attempt."""
    what = "reversal" if reversal else "step"
    return HistoryEntry(
        at=at,
        kind=Kind.CLAIM_RESTORED.value,
        step=step,
        holder=holder,
        detail=f"the store lost this {what}'s claim (a database crash or failover); its "
        "holder, still running it, wrote the claim back",
    )


def _values(execution_id: str, entry: HistoryEntry, blob: bytes | None) -> dict[str, Any]:
    actor = entry.actor[:ACTOR_WIDTH] if entry.actor else entry.actor
    return {
        "execution_id": execution_id,
        "at": to_db_time(entry.at),
        "kind": entry.kind,
        "step": entry.step,
        "attempt": entry.attempt,
        "holder": entry.holder,
        "actor": actor,
        "detail": entry.detail,
        "data": blob,
        "started_at": None if entry.started_at is None else to_db_time(entry.started_at),
    }


def write(
    connection: Connection, execution_id: str, entry: HistoryEntry, blob: bytes | None = None
) -> None:
    """Add ``entry`` inside the caller's transaction (the one of the transition it records);
    ``blob``: ``entry.data`` already encoded, else it is encoded here."""
    if blob is None and entry.data is not None:
        blob = pack(entry.data, what=f"history of {execution_id!r}")
    drivers.rowcount(connection, _insert_row(), _values(execution_id, entry, blob))


@functools.cache
def _insert_row() -> Any:
    """The row's INSERT, built once with a parameter per column ``_values`` gives."""
    names = ["execution_id", "at", "kind", "step", "attempt", "holder", "actor", "detail"]
    names += ["data", "started_at"]
    return insert(history).values(
        {name: bindparam(name, type_=history.c[name].type) for name in names}
    )


def note(
    connection: Connection,
    execution_id: str,
    kind: Kind,
    now: datetime,
    detail: str | None = None,
    *,
    step: str | None = None,
    actor: str | None = None,
    data: Any = None,
) -> None:
    """Add a row of the run itself (no attempt, no holder) inside the caller's transaction."""
    entry = HistoryEntry(now, kind.value, step=step, actor=actor, detail=detail, data=data)
    write(connection, execution_id, entry)


def write_unwind_closed(
    connection: Connection, execution_id: str, rollback: RollbackStatus, now: datetime
) -> None:
    """The ``unwind-closed`` row of an unwind that ended with nothing (more) to reverse."""
    why = f"nothing left to reverse: rollback {rollback.value}"
    note(connection, execution_id, Kind.UNWIND_CLOSED, now, why)


def write_archived(
    connection: Connection,
    execution_ids: Sequence[str],
    now: datetime,
    actor: str | None,
    detail: str,
) -> None:
    """One ``archived`` row per run, straight into the archive while the runs' live rows
    are still there: numbered after the run's last row (an index seek each), one statement
    for a whole batch."""
    actor = actor[:ACTOR_WIDTH] if actor else actor
    last = select(func.max(history.c.id)).where(history.c.execution_id == executions.c.id)
    columns = {
        "execution_id": executions.c.id,
        "id": func.coalesce(last.scalar_subquery(), 0) + 1,
        "at": literal(to_db_time(now), history.c.at.type),
        "kind": literal(Kind.ARCHIVED.value, history.c.kind.type),
        "actor": literal(actor, history.c.actor.type),
        "detail": literal(detail, history.c.detail.type),
    }
    chosen = select(*columns.values()).where(executions.c.id.in_(execution_ids))
    connection.execute(insert(history_archive).from_select(list(columns), chosen))


def write_parked(
    connection: Connection,
    execution_id: str,
    step: str | None,
    attempts: int | None,
    reason: str | None,
    now: datetime,
) -> None:
    """The ``parked`` history row: at which reversal, after how many attempts, and why."""
    entry = HistoryEntry(now, Kind.PARKED.value, step=step, attempt=attempts, detail=reason)
    write(connection, execution_id, entry)


def write_lost_row(
    connection: Connection,
    lost: StepRecord,
    kinds: tuple[Kind, Kind],
    held: tuple[int, str | None, datetime | None],
    now: datetime,
) -> None:
    """The ``kinds[0]`` row (``step-lost``, ``reversal-lost``) of the attempt that held
    ``lost`` (a record read before its takeover) as ``held`` (its number, holder and
    lease), unless that attempt gave its claim up (a ``kinds[1]`` row): its end is then
    already recorded. ``claims.taken_over`` names both per direction."""
    (lost_kind, released_kind), (attempt, holder, lease) = kinds, held
    # A resume numbers a reversal's attempts from 1 again: only rows since the last count.
    resumed = select(func.coalesce(func.max(history.c.id), 0)).where(
        history.c.execution_id == lost.execution_id,
        history.c.kind == Kind.RESUMED.value,
    )
    released = connection.execute(
        select(history.c.id).where(
            history.c.execution_id == lost.execution_id,
            history.c.kind == released_kind.value,
            history.c.step == lost.name,
            history.c.attempt == attempt,
            history.c.id > resumed.scalar_subquery(),
        )
    ).first()
    if released is not None:
        return
    lapsed = lease is not None and lease <= now
    why = "its lease lapsed" if lapsed else "its holder was found gone"
    entry = HistoryEntry(
        now,
        lost_kind.value,
        step=lost.name,
        attempt=attempt,
        holder=holder,
        detail=f"never settled; taken over ({why})",
    )
    write(connection, lost.execution_id, entry)


def append(
    db: Database,
    execution_id: str,
    entry: HistoryEntry,
    blob: bytes | None = None,
) -> None:
    """Add ``entry`` on its own (``blob``: ``entry.data`` already encoded)."""
    with db.single_statement() as connection:
        write(connection, execution_id, entry, blob)


def _entry(row: Any) -> HistoryEntry:
    return HistoryEntry(
        at=from_db_time(row["at"]) or datetime.min,
        kind=row["kind"],
        step=row["step"],
        attempt=row["attempt"],
        holder=row["holder"],
        actor=row["actor"],
        detail=row["detail"],
        data=unpack_or_sealed(row["data"]),
        id=row["id"],
        started_at=from_db_time(row["started_at"]),
    )


def load(
    db: Database, execution_id: str, archived: bool = False, after: int | None = None
) -> list[HistoryEntry]:
    """The run's history, oldest first (``archived``: from the archive; ``after``: only the
    rows written after the row with that id, one index seek)."""
    table = history_archive if archived else history
    query = select(table).where(table.c.execution_id == execution_id)
    if after is not None:
        query = query.where(table.c.id > after)
    rows: Sequence[Any] = db.read(query.order_by(table.c.id))
    return [_entry(row) for row in rows]
