"""How the store runs a statement built once: one strategy per database, chosen at start.

``Database`` picks its strategy when it is built, from the driver its URL names
(``choose``): with psycopg or sqlite3 the hot path's statements go straight to the
driver's cursor (``direct``, over the sender in ``postgres`` or ``sqlite``), with every
other driver SQLAlchemy runs them (``alchemy``). Nothing later asks which backend it is:
store code runs a statement through one of two entry points, ``rowcount`` for a write and
``rows`` for a statement that returns rows, which find the strategy of the connection's
engine. A statement built per call (its shape depends on the values) is run by
``Connection.execute``, whose compiled cache serves it; these entry points compile what
they are given once and keep it.

Two things the start cannot know are honoured by the direct strategy itself, at each
statement, by handing it to SQLAlchemy's strategy (``direct.Direct``):

- someone listening to the engine's statement events (a tracing integration, a test's
  probe), which may start at any time: SQLAlchemy must run the statement for the listener
  to see it. The store's own statement counter is not such a listener; a direct strategy
  calls it itself.
- on PostgreSQL, a transaction open on the connection: SQLAlchemy keeps its state, and
  psycopg's path runs single statements in autocommit. SQLite's transaction lives on the
  driver's connection (the store sends BEGIN IMMEDIATE there), so sqlite3's path stays.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import Connection, Engine

from celery_saga.store.drivers.alchemy import ALCHEMY
from celery_saga.store.drivers.direct import Direct
from celery_saga.store.drivers.postgres import Psycopg
from celery_saga.store.drivers.protocol import AUTOCOMMIT, Counter, Driver, Rows
from celery_saga.store.drivers.sqlite import Sqlite3, raised_by_sqlite3
from celery_saga.store.drivers.sqlite import configure as configure_sqlite

__all__ = [
    "ALCHEMY",
    "AUTOCOMMIT",
    "Driver",
    "Rows",
    "choose",
    "configure_sqlite",
    "of",
    "raised_by_sqlite3",
    "rowcount",
    "rows",
    "use",
]

#: Each store engine's strategy. An engine not built by ``Database`` gets SQLAlchemy's.
_CHOSEN: weakref.WeakKeyDictionary[Engine, Driver] = weakref.WeakKeyDictionary()


def choose(engine: Engine, own: Counter) -> Driver:
    """The strategy for ``engine``'s driver; ``own``: the store's statement counter."""
    driver = engine.dialect.driver
    if driver == "psycopg":
        return Direct(Psycopg(own))
    if driver == "pysqlite":
        return Direct(Sqlite3(own))
    return ALCHEMY


def use(engine: Engine, driver: Driver) -> None:
    """Run ``engine``'s statements with ``driver`` from now on."""
    _CHOSEN[engine] = driver


def of(engine: Engine) -> Driver:
    """The strategy ``engine``'s statements run with."""
    return _CHOSEN.get(engine, ALCHEMY)


def rowcount(connection: Connection, statement: Any, params: dict[str, Any]) -> int:
    """Run one write built once; the rows it changed."""
    return of(connection.engine).rowcount(connection, statement, params)


def rows(connection: Connection, statement: Any, params: dict[str, Any]) -> Rows:
    """Run one statement built once that returns rows; each row maps column key to value."""
    return of(connection.engine).rows(connection, statement, params)
