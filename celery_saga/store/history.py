"""A run's history: append-only rows of what happened to it, kept and archived with it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select

from celery_saga.store.codec import unpack_or_sealed
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.tables import history, history_archive


@dataclass(frozen=True)
class HistoryEntry:
    """One row: ``kind`` says what happened (``late-outcome``: a body's outcome that
    arrived after its claim had been taken over), ``data`` holds a value it carried."""

    at: datetime
    kind: str
    step: str | None = None
    attempt: int | None = None
    holder: str | None = None
    actor: str | None = None
    detail: str | None = None
    data: Any = None


def append(
    db: Database,
    execution_id: str,
    entry: HistoryEntry,
    blob: bytes | None = None,
) -> None:
    """Add ``entry`` to the run's history (``blob``: ``entry.data`` already encoded)."""
    with db.single_statement() as connection:
        connection.execute(
            insert(history).values(
                execution_id=execution_id,
                at=to_db_time(entry.at),
                kind=entry.kind,
                step=entry.step,
                attempt=entry.attempt,
                holder=entry.holder,
                actor=entry.actor,
                detail=entry.detail,
                data=blob,
            )
        )


def load(db: Database, execution_id: str, archived: bool = False) -> list[HistoryEntry]:
    """The run's history, oldest first (``archived``: from the archive)."""
    table = history_archive if archived else history
    rows = db.read(select(table).where(table.c.execution_id == execution_id).order_by(table.c.id))
    return [
        HistoryEntry(
            at=from_db_time(row["at"]) or datetime.min,
            kind=row["kind"],
            step=row["step"],
            attempt=row["attempt"],
            holder=row["holder"],
            actor=row["actor"],
            detail=row["detail"],
            data=unpack_or_sealed(row["data"]),
        )
        for row in rows
    ]
