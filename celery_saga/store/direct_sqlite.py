"""The hot path's statements sent straight to sqlite3: the embedded default's store.

As ``direct`` does for psycopg, and for the same reason: SQLAlchemy's execution of a
statement built once (an execution context, parameter processing, a result object) cost
more CPU than sqlite3's call and SQLite's work together, and a node runs about four of
them. Measured 2026-12-05 on the step claim (2 cores shared with other work, SQLite 3.40,
SQLAlchemy 2.1): 66 us of CPU through ``Connection.execute``, 25 us here.

Unlike psycopg's path this one also runs inside a transaction: SQLite's transaction lives
on the driver's connection, and the store sends its BEGIN IMMEDIATE there itself
(``database._configure_sqlite``), so SQLAlchemy keeps no state a statement here could
bypass. Values go through the columns' own type processing both ways (SQLite keeps
datetimes as text), exactly as SQLAlchemy would apply it. A statement this path cannot
send as it is (one with expanding or escaped parameters) goes through SQLAlchemy.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, exc

Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class Prepared:
    sql: str
    #: Parameter names in the order of the statement's ``?`` (a name may come twice).
    names: tuple[str, ...]
    #: Values the statement carries itself (its literals, sent as parameters).
    constants: dict[str, Any]
    #: Type processing of each parameter that has some.
    binds: dict[str, Processor]
    #: Each result column's key and type processing (None: none).
    columns: tuple[tuple[str, Processor | None], ...]


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
        process = bind.type._cached_bind_processor(dialect)
        if process is not None:
            binds[name] = process
    columns = tuple(
        (column.keyname, column.type._cached_result_processor(dialect, None))
        for column in compiled._result_columns
    )
    constants = {
        name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required
    }
    return Prepared(sql, tuple(order), constants, binds, columns)


def rowcount(connection: Connection, prepared: Prepared, params: dict[str, Any], own: Any) -> int:
    """Run one write; the rows it changed. ``own``: the store's statement counter."""
    return int(_run(connection, prepared, params, own, lambda cursor: cursor.rowcount))


def rows(
    connection: Connection, prepared: Prepared, params: dict[str, Any], own: Any
) -> Sequence[Mapping[Any, Any]]:
    """Run one statement that returns rows; each row maps column key to value."""

    def read(cursor: Any) -> list[dict[str, Any]]:
        keys = [key for key, _ in prepared.columns]
        processors = [
            (index, process)
            for index, (_, process) in enumerate(prepared.columns)
            if process is not None
        ]
        result = []
        for row in cursor.fetchall():
            values = list(row)
            for index, process in processors:
                values[index] = process(values[index])
            result.append(dict(zip(keys, values, strict=True)))
        return result

    found: Sequence[Mapping[Any, Any]] = _run(connection, prepared, params, own, read)
    return found


def _run(
    connection: Connection,
    prepared: Prepared,
    params: dict[str, Any],
    own: Any,
    read: Callable[[Any], Any],
) -> Any:
    values = {**prepared.constants, **params}
    for name, process in prepared.binds.items():
        if name in values:
            values[name] = process(values[name])
    ordered = tuple(values[name] for name in prepared.names)
    driver = connection.connection.dbapi_connection
    assert driver is not None
    try:
        cursor = driver.cursor()
        try:
            own(connection, cursor, prepared.sql, ordered, None, False)
            cursor.execute(prepared.sql, ordered)
            return read(cursor)
        finally:
            cursor.close()
    except sqlite3.Error as error:  # as SQLAlchemy's: IntegrityError, a busy OperationalError
        raise exc.DBAPIError.instance(
            prepared.sql, ordered, error, sqlite3.Error, dialect=connection.dialect
        ) from error
