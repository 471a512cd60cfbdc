"""Operators' reads off a read replica of the store, and how far behind that replica is.

The engine runs every saga on its store (``saga_store_url``, the primary). With
``saga_read_store_url`` set, the engine's ``Database`` carries a second one, its
``replica``, and the reads for people (``store.inspection``: ``list``, ``show``, ``stats``,
the web view, the store gauges) go there through ``reads(db)``; nothing that decides what a
run does next reads it. A replica shows the store as it was a moment ago: ``replica_lag``
reads how long, for a view to say so (docs/storage.md, "Reading from a replica").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.errors import StoreConfigurationError
from celery_saga.store import url_errors
from celery_saga.store.database import Database

#: One statement on a PostgreSQL replica: is it a standby, is its WAL receiver streaming
#: from the primary, has it replayed all it received, and how old (by its clock) is the last
#: transaction it replayed. The Django admin runs it on its own connection (``lag_of_row``).
STANDING_QUERY = (
    "SELECT pg_is_in_recovery() AS standby,"
    " EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming') AS streaming,"
    " pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() AS replayed,"
    " EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()) AS since"
)
_STANDING = text(STANDING_QUERY)


class Standing(enum.Enum):
    """Where the reads of a view stand against the store that runs the sagas."""

    PRIMARY = "primary"  # no replica: the reads are the store's own
    CAUGHT_UP = "caught_up"  # streaming, and everything received is replayed
    BEHIND = "behind"  # streaming, with received changes not replayed yet
    DISCONNECTED = "disconnected"  # receives nothing from the primary now
    PROMOTED = "promoted"  # not a standby: it no longer follows the store
    UNKNOWN = "unknown"  # a backend whose lag is not read here
    UNREADABLE = "unreadable"  # the replica did not answer


@dataclass(frozen=True)
class ReplicaLag:
    """How stale a view's reads may be: ``behind`` is at most how old they are (the age of
    the last change the replica replayed), None when it cannot be told."""

    standing: Standing
    behind: timedelta | None = None
    problem: str = ""

    @property
    def worth_saying(self) -> bool:
        """A view says where it stands unless its reads are current."""
        return self.standing not in (Standing.PRIMARY, Standing.CAUGHT_UP)

    def describe(self) -> str:
        """One line for a view: what it reads and how far behind the store that is."""
        age = "" if self.behind is None else _age(self.behind)
        if self.standing is Standing.PRIMARY:
            return "read from the store"
        if self.standing is Standing.CAUGHT_UP:
            return "read from a replica that is caught up with the store"
        if self.standing is Standing.BEHIND:
            by = f"up to {age}" if age else "an unknown time"
            return f"read from a replica {by} behind the store"
        if self.standing is Standing.DISCONNECTED:
            last = f"; its last change was replayed {age} ago" if age else ""
            return f"read from a replica that receives nothing from the store now{last}"
        if self.standing is Standing.PROMOTED:
            return "read from a replica that is no longer a standby: it does not follow the store"
        if self.standing is Standing.UNREADABLE:
            return f"read from a replica that could not say how far behind it is: {self.problem}"
        return f"read from a replica; its lag is not read on {self.problem}"


def _age(behind: timedelta) -> str:
    seconds = behind.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def standing_of(
    standby: bool, streaming: bool, replayed: bool, since_replay: float | None
) -> ReplicaLag:
    """The rule (docs/storage.md): a streaming standby that replayed all it received is
    caught up (behind by the network's delay at most); one with changes left to replay, or
    cut off from the primary, is at most as old as the last change it replayed."""
    if not standby:
        return ReplicaLag(Standing.PROMOTED)
    behind = None if since_replay is None else timedelta(seconds=max(since_replay, 0.0))
    if not streaming:
        return ReplicaLag(Standing.DISCONNECTED, behind)
    if replayed:
        return ReplicaLag(Standing.CAUGHT_UP, timedelta(0))
    return ReplicaLag(Standing.BEHIND, behind)


def replica_lag(db: Database) -> ReplicaLag:
    """Where ``db``'s operator reads stand: PRIMARY without a replica, else read from the
    replica (one statement); a replica that cannot be read is UNREADABLE, not an error, so
    a view can still say it."""
    replica = db.replica
    if replica is None:
        return ReplicaLag(Standing.PRIMARY, timedelta(0))
    if replica.dialect != "postgresql":
        return ReplicaLag(Standing.UNKNOWN, problem=replica.dialect)
    try:
        row = replica.read(_STANDING)[0]
    except SQLAlchemyError as error:
        return unreadable(error)
    return lag_of_row(row)


def lag_of_row(row: Mapping[str, Any]) -> ReplicaLag:
    """The standing that a row of ``STANDING_QUERY`` reads as."""
    since = row["since"]
    return standing_of(
        bool(row["standby"]),
        bool(row["streaming"]),
        bool(row["replayed"]),
        None if since is None else float(since),
    )


def unreadable(error: Exception) -> ReplicaLag:
    """A replica that did not answer the query, with the first line of what was said."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ReplicaLag(Standing.UNREADABLE, problem=first)


def reads(db: Database) -> Database:
    """The database operators' reads go to: ``db``'s replica when it has one, else ``db``."""
    return db.replica or db


def open_replica(db: Database, read_url: str | None) -> Database | None:
    """The replica ``saga_read_store_url`` names for the store ``db``, None when unset (or
    the store itself). Raises ``StoreConfigurationError`` for a URL that cannot be read or
    names another kind of database than the store: a replica is a copy of the store."""
    if not read_url or read_url == db.url:
        return None
    try:
        dialect = url_errors.parse(read_url).get_backend_name()
    except StoreConfigurationError as error:
        raise StoreConfigurationError(f"saga_read_store_url: {error}") from None
    if dialect != db.dialect:
        raise StoreConfigurationError(
            f"saga_read_store_url names a {dialect} database and saga_store_url a "
            f"{db.dialect} one: the read store must be a replica of the store"
        )
    return Database(read_url)
