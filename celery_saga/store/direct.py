"""The hot path's statements sent straight to the driver (PostgreSQL through psycopg;
SQLite through sqlite3 in ``direct_sqlite``).

For the few statements every step runs, SQLAlchemy's execution (an execution context,
parameter processing, a result object, events) cost more CPU than psycopg's own call and
the server's work together. These statements are compiled once to the driver's SQL and
run on the connection's own cursor; errors are turned into SQLAlchemy's exceptions and a
dropped connection is invalidated, exactly as SQLAlchemy would, so retries and outage
handling see no difference. Anywhere else (another backend or driver, a transaction
already open, or someone listening to the engine's statement events, such as a tracing
integration) the statement goes through SQLAlchemy as usual.

Measured 2026-12-04 (``benchmarks/direct_statements.py --count 3000``, twice; 2 cores shared
with other work, PostgreSQL 15 on the same host, SQLAlchemy 2.1, psycopg 3.3), against the
same statements built once and run by ``Connection.execute`` on the same connection,
interleaved: the direct path spends 40-48% less client CPU per statement at the median,
0.10-0.20 ms, and its wall time drops by about as much. Client CPU, direct against
SQLAlchemy, in ms: step claim 0.13-0.18 against 0.24-0.33, step-completed write 0.13-0.17
against 0.24-0.30, reversal claim 0.21-0.29 against 0.35-0.48, snapshot read 0.15-0.20
against 0.28-0.39, the run's INSERT 0.13-0.18 against 0.23-0.30.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, exc

from celery_saga.store import direct_sqlite

#: Events that see or change statement execution: with a listener on any (but the store's
#: own counter), SQLAlchemy runs them.
_ENGINE_EVENTS = ("before_cursor_execute", "after_cursor_execute")
_DIALECT_EVENTS = ("do_execute", "do_execute_no_params", "handle_error")


@dataclass(frozen=True)
class Compiled:
    sql: str
    #: Values the statement carries itself (its literals, sent as parameters).
    constants: dict[str, Any]


@functools.lru_cache(maxsize=512)  # bounded: only statements built once should come here
def _compiled(statement: Any, engine: Engine) -> Compiled:
    compiled = statement.compile(dialect=engine.dialect)
    constants = {
        name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required
    }
    return Compiled(str(compiled), constants)


def _observed(engine: Engine, own: Any) -> bool:
    """Whether anyone but ``own`` (the store's statement counter) listens to statements."""
    listeners = itertools.chain(
        *(getattr(engine.dispatch, name) for name in _ENGINE_EVENTS),
        *(getattr(engine.dialect.dispatch, name, ()) for name in _DIALECT_EVENTS),
    )
    return any(listener != own for listener in listeners)


def applies(connection: Connection, own: Any) -> bool:
    """Whether a write on ``connection`` now would go to the driver directly: psycopg
    outside a transaction, sqlite3 anywhere (see ``direct_sqlite``)."""
    engine = connection.engine
    driver = engine.dialect.driver
    if driver == "psycopg" and connection.in_transaction():
        return False
    return driver in ("psycopg", "pysqlite") and not _observed(engine, own)


def _sqlite(connection: Connection, statement: Any) -> direct_sqlite.Prepared | None:
    if connection.engine.dialect.driver != "pysqlite":
        return None
    return direct_sqlite.prepare(statement, connection.engine)


def rowcount(connection: Connection, statement: Any, params: dict[str, Any], own: Any) -> int:
    """Run one write and return its row count (the rows it changed). ``own``: the store's
    ``before_cursor_execute`` listener, told of a statement run directly. ``statement``
    must be built once (with bind parameters) and reused: it is compiled once."""
    if not applies(connection, own):
        return int(connection.execute(statement, params).rowcount)
    if (prepared := _sqlite(connection, statement)) is not None:
        return direct_sqlite.rowcount(connection, prepared, params, own)
    if connection.engine.dialect.driver != "psycopg":
        return int(connection.execute(statement, params).rowcount)
    return int(_run(connection, statement, params, own, lambda cursor: cursor.rowcount))


def rows(
    connection: Connection, statement: Any, params: dict[str, Any], own: Any
) -> Sequence[Mapping[Any, Any]]:
    """Run one statement that returns rows; each row maps column to value."""
    if not applies(connection, own):
        return list(connection.execute(statement, params).mappings())
    if (prepared := _sqlite(connection, statement)) is not None:
        return direct_sqlite.rows(connection, prepared, params, own)
    if connection.engine.dialect.driver != "psycopg":
        return list(connection.execute(statement, params).mappings())
    result: Sequence[Mapping[Any, Any]] = _run(connection, statement, params, own, _mappings)
    return result


def _mappings(cursor: Any) -> list[dict[str, Any]]:
    rows = cursor.fetchall()
    if not rows:
        return []
    # Field names straight from the result: psycopg's ``description`` builds a column
    # object (with a type lookup) per field, which cost more than the rows themselves.
    result = cursor.pgresult
    names = [result.fname(index).decode() for index in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in rows]


def _run(
    connection: Connection,
    statement: Any,
    params: dict[str, Any],
    own: Any,
    read: Callable[[Any], Any],
) -> Any:
    engine = connection.engine
    compiled = _compiled(statement, engine)
    values = {**compiled.constants, **params}
    driver = connection.connection.dbapi_connection  # reconnects an invalidated connection
    assert driver is not None
    dbapi = engine.dialect.loaded_dbapi
    try:
        if not driver.autocommit:
            driver.autocommit = True  # the mode single statements run in (see database.py)
        cursor = driver.cursor()
        try:
            own(connection, cursor, compiled.sql, values, None, False)
            cursor.execute(compiled.sql, values)
            return read(cursor)
        finally:
            cursor.close()
    except dbapi.Error as error:
        dropped = bool(engine.dialect.is_disconnect(error, driver, None))
        if dropped:
            connection.invalidate(error)
        raise exc.DBAPIError.instance(
            compiled.sql,
            values,
            error,
            dbapi.Error,
            connection_invalidated=dropped,
            dialect=engine.dialect,
        ) from error
    except BaseException:
        # Interrupted mid-exchange (a time limit, a signal): the protocol state is unknown.
        connection.invalidate()
        raise
