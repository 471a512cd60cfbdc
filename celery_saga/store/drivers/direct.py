"""Statements sent to the database driver itself: the strategy psycopg and sqlite3 share.

``Direct`` holds what both do alike: it hands a statement to SQLAlchemy's strategy while
someone else listens to the engine's statements, when its sender steps aside (psycopg in
a transaction) or cannot send it as it is (``prepare`` gives None), and otherwise lets
the sender run it on the driver's cursor. A ``Sender`` holds what differs per driver:
compiling, parameter and result processing, and turning the driver's errors into
SQLAlchemy's.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

from sqlalchemy import Connection, Engine

from celery_saga.store.drivers.alchemy import ALCHEMY
from celery_saga.store.drivers.protocol import Counter, Params, Read, Rows, observed


class Sender(Protocol):
    """One driver's way to send a statement built once, counted by ``own``."""

    own: Counter

    def steps_aside(self, connection: Connection) -> bool:
        """Whether SQLAlchemy must run statements on ``connection`` now."""
        ...

    def prepare(self, statement: Any, engine: Engine) -> Any:
        """``statement`` made ready once for ``engine``; None: SQLAlchemy must run it."""
        ...

    def send(self, connection: Connection, prepared: Any, params: Params, read: Read) -> Any:
        """Run ``prepared`` on the driver's cursor; ``read(cursor)``."""
        ...

    def mappings(self, cursor: Any, statement: Any, engine: Engine) -> list[dict[str, Any]]:
        """The rows ``cursor`` returned for ``statement``, each mapping key to value."""
        ...


#: What a write returns: the rows it changed.
_ROWCOUNT = operator.attrgetter("rowcount")


class Direct:
    """A ``Driver`` sending the store's statements through ``sender``."""

    def __init__(self, sender: Sender) -> None:
        self.own = sender.own
        self.sender = sender

    def direct(self, connection: Connection) -> bool:
        if self.sender.steps_aside(connection):
            return False
        return not observed(connection.engine, self.own)

    def _prepared(self, connection: Connection, statement: Any) -> Any:
        if not self.direct(connection):
            return None
        return self.sender.prepare(statement, connection.engine)

    def rowcount(self, connection: Connection, statement: Any, params: dict[str, Any]) -> int:
        prepared = self._prepared(connection, statement)
        if prepared is None:
            return ALCHEMY.rowcount(connection, statement, params)
        return int(self.sender.send(connection, prepared, params, _ROWCOUNT))

    def rows(self, connection: Connection, statement: Any, params: dict[str, Any]) -> Rows:
        prepared = self._prepared(connection, statement)
        if prepared is None:
            return ALCHEMY.rows(connection, statement, params)
        engine = connection.engine

        def read(cursor: Any) -> list[dict[str, Any]]:
            return self.sender.mappings(cursor, statement, engine)

        found: Rows = self.sender.send(connection, prepared, params, read)
        return found
