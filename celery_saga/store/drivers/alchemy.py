"""Statements run by SQLAlchemy's own execution: every backend's and driver's strategy but
psycopg's and sqlite3's, and theirs whenever they step aside (see ``drivers``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from celery_saga.store.drivers.protocol import Rows


class Alchemy:
    """``Connection.execute``, with its events, result objects and compiled cache."""

    def direct(self, connection: Connection) -> bool:
        return False

    def rowcount(self, connection: Connection, statement: Any, params: dict[str, Any]) -> int:
        return int(connection.execute(statement, params).rowcount)

    def rows(self, connection: Connection, statement: Any, params: dict[str, Any]) -> Rows:
        return list(connection.execute(statement, params).mappings())


#: Stateless: one value serves every engine.
ALCHEMY = Alchemy()
