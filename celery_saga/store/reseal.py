"""Moving stored payloads to the codec's newest key (``celery saga db reencrypt``).

Each payload column is walked in primary-key order, a batch per transaction; a payload
sealed with another key, or stored plain before the codec was on, is opened and sealed again
with the newest key. The write is conditional on the old bytes, so a row a worker rewrote
meanwhile is left as that worker wrote it (it is counted, not overwritten).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Table, and_, bindparam, select, tuple_, update

from celery_saga.errors import PayloadKeyError
from celery_saga.store.codec import PayloadCodec, open_sealed, seal, sealed_key
from celery_saga.store.database import Database
from celery_saga.store.tables import (
    decisions,
    decisions_archive,
    executions,
    executions_archive,
    history,
    history_archive,
    signals,
    signals_archive,
    step_records,
    step_records_archive,
)

#: Every payload column: (table, its key columns, the payload column).
PAYLOAD_COLUMNS: tuple[tuple[Table, tuple[str, ...], str], ...] = (
    (executions, ("id",), "input"),
    (step_records, ("id",), "result"),
    (signals, ("execution_id", "event"), "payload"),
    (decisions, ("execution_id", "key"), "value"),
    (history, ("id",), "data"),
    (executions_archive, ("id",), "input"),
    (step_records_archive, ("execution_id", "name"), "result"),
    (signals_archive, ("execution_id", "event"), "payload"),
    (decisions_archive, ("execution_id", "key"), "value"),
    (history_archive, ("execution_id", "id"), "data"),
)


@dataclass
class ResealCount:
    """What one column's walk found: payloads moved to the newest key, already on it,
    changed by someone else between the read and the write, left as they are because this
    process cannot open them (by key id), and the keys met."""

    table: str
    column: str
    resealed: int = 0
    current: int = 0
    changed_meanwhile: int = 0
    unreadable: dict[str, int] = field(default_factory=dict)
    keys_met: dict[str, int] = field(default_factory=dict)


def reseal_all(
    db: Database,
    codec: PayloadCodec,
    newest: str,
    batch_size: int = 500,
    progress: Callable[[ResealCount], None] | None = None,
) -> list[ResealCount]:
    """Walk every payload column; ``progress`` is called after each batch."""
    counts = []
    for table, keys, column in PAYLOAD_COLUMNS:
        count = ResealCount(table.name, column)
        for batch in _batches(db, table, keys, column, batch_size):
            _reseal_batch(db, codec, newest, table, keys, column, batch, count)
            if progress is not None:
                progress(count)
        counts.append(count)
    return counts


def _batches(
    db: Database, table: Table, keys: tuple[str, ...], column: str, size: int
) -> Iterator[list[Any]]:
    """The table's (key..., payload) rows with a payload, ``size`` at a time, by key."""
    key_columns = [table.c[name] for name in keys]
    ordered = tuple_(*key_columns) if len(key_columns) > 1 else key_columns[0]
    after: tuple[Any, ...] | None = None
    while True:
        query = select(*key_columns, table.c[column]).where(table.c[column].is_not(None))
        if after is not None:
            bound = tuple_(*after) if len(after) > 1 else after[0]
            query = query.where(ordered > bound)
        rows = db.read(query.order_by(*key_columns).limit(size))
        if not rows:
            return
        yield [tuple(row[name] for name in (*keys, column)) for row in rows]
        last = rows[-1]
        after = tuple(last[name] for name in keys)


def _reseal_batch(
    db: Database,
    codec: PayloadCodec,
    newest: str,
    table: Table,
    keys: tuple[str, ...],
    column: str,
    batch: list[Any],
    count: ResealCount,
) -> None:
    changes = []
    for *key_values, old in batch:
        key_id = sealed_key(old) or "(plain)"
        count.keys_met[key_id] = count.keys_met.get(key_id, 0) + 1
        if key_id == newest:
            count.current += 1
            continue
        try:
            new = seal(open_sealed(old, codec), codec)
        except PayloadKeyError as missing:  # counted and named; the walk goes on
            count.unreadable[missing.key_id] = count.unreadable.get(missing.key_id, 0) + 1
            continue
        named = {f"k_{name}": value for name, value in zip(keys, key_values, strict=True)}
        changes.append({**named, "old": old, "new": new})
    if not changes:
        return
    statement = (
        update(table)
        .where(and_(*(_key_match(table.c[name], name) for name in keys)))
        .where(table.c[column] == bindparam("old", type_=table.c[column].type))
        .values({column: bindparam("new", type_=table.c[column].type)})
    )
    with db.transaction() as connection:
        written = 0
        for change in changes:  # one by one: a rowcount per row says who changed meanwhile
            written += connection.execute(statement, change).rowcount
    count.resealed += written
    count.changed_meanwhile += len(changes) - written


def _key_match(column: Column[Any], name: str) -> Any:
    return column == bindparam(f"k_{name}", type_=column.type)
