"""Each version's shape in the store (``saga_version_shapes``): written once per saga and
hash, never changed (a hash names one shape), read by ``upgrade`` and ``saga versions
check`` for versions their process does not have. One transaction per function."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from celery_saga.store.database import Database, to_db_time
from celery_saga.store.tables import version_shapes

#: One version's shape as stored: (saga, hash, label, the JSON text its hash is taken of).
Shape = tuple[str, str, str | None, str]


def record_shapes(db: Database, shapes: Sequence[Shape], *, now: datetime) -> int:
    """Store the ``shapes`` not stored yet (one read of their sagas' rows, one insert each);
    returns how many were new. Two processes recording one version at once: the second's
    insert meets the first's row, and it reads again and finds it there."""
    try:
        return _record(db, shapes, now)
    except IntegrityError:
        return _record(db, shapes, now)


def _record(db: Database, shapes: Sequence[Shape], now: datetime) -> int:
    if not shapes:
        return 0
    stamp = to_db_time(now)
    with db.transaction() as connection:
        stored = {
            (r.saga_name, r.definition_hash)
            for r in connection.execute(
                select(version_shapes.c.saga_name, version_shapes.c.definition_hash).where(
                    version_shapes.c.saga_name.in_(sorted({s[0] for s in shapes}))
                )
            )
        }
        missing = {(s[0], s[1]): s for s in shapes if (s[0], s[1]) not in stored}
        for saga_name, definition_hash, label, text in missing.values():
            connection.execute(
                insert(version_shapes).values(
                    saga_name=saga_name,
                    definition_hash=definition_hash,
                    label=label,
                    shape=text,
                    recorded_at=stamp,
                )
            )
    return len(missing)


def load_shapes(db: Database, versions: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The stored shape texts of these (saga, hash) versions, by version; a version whose
    shape was never stored is absent."""
    wanted = set(versions)
    if not wanted:
        return {}
    query = select(
        version_shapes.c.saga_name, version_shapes.c.definition_hash, version_shapes.c.shape
    ).where(  # both columns of the primary key: a seek per saga, not a scan
        version_shapes.c.saga_name.in_(sorted({s for s, _ in wanted})),
        version_shapes.c.definition_hash.in_(sorted({h for _, h in wanted})),
    )
    return {
        (r["saga_name"], r["definition_hash"]): r["shape"]
        for r in db.read(query)
        if (r["saga_name"], r["definition_hash"]) in wanted
    }
