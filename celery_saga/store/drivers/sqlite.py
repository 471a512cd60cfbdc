"""The hot path's statements sent straight to sqlite3: the embedded default's store.

As for psycopg (``postgres``), and for the same reason: SQLAlchemy's execution of a
statement built once (an execution context, parameter processing, a result object) cost
more CPU than sqlite3's call and SQLite's work together, and a node runs about four of
them. Measured 2026-12-05 on the step claim (2 cores shared with other work, SQLite 3.40,
SQLAlchemy 2.1): 66 us of CPU through ``Connection.execute``, 25 us here.

Unlike psycopg's path this one also runs inside a transaction: SQLite's transaction lives
on the driver's connection, and the store sends its BEGIN IMMEDIATE there itself
(``configure``), so SQLAlchemy keeps no state a statement here could
bypass. Values go through the columns' own type processing both ways (SQLite keeps
datetimes as text), exactly as SQLAlchemy applies it, through public API only: each
type's ``dialect_impl`` gives its bind and result processors, the compiled RETURNING or
the select's ``selected_columns`` the result columns in order, and the cursor's
description their keys. A statement this path cannot send as
it is (one with expanding or escaped parameters) goes through SQLAlchemy.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event, exc

from celery_saga.store.drivers.protocol import (
    AUTOCOMMIT,
    Counter,
    Params,
    Read,
    constants,
    on_cursor,
)

Processor = Callable[[Any], Any]


def configure(engine: Engine, synchronous: str) -> None:
    """Set a SQLite engine up: WAL, a busy timeout, foreign keys, ``synchronous`` (a
    ``PRAGMA synchronous`` value) on each connection, and transactions that begin
    IMMEDIATE, sent to sqlite3 itself."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Let the "begin" event below issue BEGIN IMMEDIATE instead of pysqlite's BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in (
            "journal_mode=WAL",
            "busy_timeout=30000",
            "foreign_keys=ON",
            f"synchronous={synchronous}",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        if connection.get_execution_options().get(AUTOCOMMIT, False):
            return  # a single statement: see ``Database.single_statement``
        # Writers are serialised up front: a deferred transaction that later upgrades to a
        # write lock can fail with SQLITE_BUSY regardless of the busy timeout. Sent to the
        # driver itself: SQLAlchemy's execution of it cost more CPU than SQLite's work.
        driver = connection.connection.dbapi_connection
        try:
            driver.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
        except sqlite3.Error as error:  # "database is locked": transient, as SQLAlchemy says
            raise exc.DBAPIError.instance(
                "BEGIN IMMEDIATE", None, error, sqlite3.Error, dialect=connection.dialect
            ) from error


def raised_by_sqlite3(error: BaseException | None) -> bool:
    """Whether ``error`` (a SQLAlchemy error's ``orig``) is sqlite3's."""
    return isinstance(error, sqlite3.Error)


@dataclass(frozen=True, eq=False)
class Prepared:
    sql: str
    #: Parameter names in the order of the statement's ``?`` (a name may come twice).
    names: tuple[str, ...]
    #: Values the statement carries itself (its literals, sent as parameters).
    constants: dict[str, Any]
    #: Type processing of each parameter that has some.
    binds: dict[str, Processor]
    #: The statement as compiled, for its result columns (``results``).
    compiled: Any


@functools.lru_cache(maxsize=512)  # bounded: only statements built once should come here
def prepare(statement: Any, engine: Engine) -> Prepared | None:
    """``statement`` compiled once for ``engine``; None if SQLAlchemy must run it."""
    dialect = engine.dialect
    compiled = statement.compile(dialect=dialect)
    sql = str(compiled)
    order = compiled.positiontup
    if order is None or compiled.escaped_bind_names or "POSTCOMPILE" in sql:
        return None
    binds = {}
    for name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            binds[name] = process
    return Prepared(sql, tuple(order), constants(compiled), binds, compiled)


@functools.lru_cache(maxsize=512)
def results(statement: Any, engine: Engine) -> tuple[tuple[int, Processor], ...]:
    """The type processing of each result column that has some, by position.

    Asked only of a statement read for its rows: a write's RETURNING columns are memoized
    on the statement once read, even when it has none, and the memo would carry into a
    copy that adds a RETURNING (``prepared.new_run_started`` builds one on ``new_run``).
    """
    prepared = prepare(statement, engine)
    assert prepared is not None
    dialect = engine.dialect
    compiled = prepared.compiled
    columns = compiled.effective_returning
    if columns is None:
        columns = getattr(statement, "selected_columns", ())
    processors = (
        column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
    )
    return tuple((index, p) for index, p in enumerate(processors) if p is not None)


class Sqlite3:
    """sqlite3's ``Sender``: in and out of transactions; a statement it cannot send as it
    is goes through SQLAlchemy (``prepare`` gives None)."""

    def __init__(self, own: Counter) -> None:
        self.own = own

    def steps_aside(self, connection: Connection) -> bool:
        return False

    def prepare(self, statement: Any, engine: Engine) -> Prepared | None:
        return prepare(statement, engine)

    def send(self, connection: Connection, prepared: Prepared, params: Params, read: Read) -> Any:
        values = {**prepared.constants, **params}
        for name, process in prepared.binds.items():
            if name in values:
                values[name] = process(values[name])
        ordered = tuple(map(values.__getitem__, prepared.names))  # no generator to resume
        try:
            return on_cursor(connection, self.own, prepared.sql, ordered, read)
        except sqlite3.Error as error:  # as SQLAlchemy's: IntegrityError, a busy OperationalError
            raise exc.DBAPIError.instance(
                prepared.sql, ordered, error, sqlite3.Error, dialect=connection.dialect
            ) from error

    def mappings(self, cursor: Any, statement: Any, engine: Engine) -> list[dict[str, Any]]:
        found = cursor.fetchall()
        if not found:
            return []
        keys = [column[0] for column in cursor.description]
        processors = results(statement, engine)
        rows = []
        for row in found:
            values = list(row)
            for index, process in processors:
                values[index] = process(values[index])
            rows.append(dict(zip(keys, values, strict=True)))
        return rows
