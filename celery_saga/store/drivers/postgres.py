"""The hot path's statements sent straight to psycopg (PostgreSQL).

For the few statements every step runs, SQLAlchemy's execution (an execution context,
parameter processing, a result object, events) cost more CPU than psycopg's own call and
the server's work together. These statements are compiled once to the driver's SQL and
run on the connection's own cursor; errors are turned into SQLAlchemy's exceptions and a
dropped connection is invalidated, exactly as SQLAlchemy would, so retries and outage
handling see no difference. Inside a transaction, or while someone else listens to the
engine's statements, SQLAlchemy runs them (see ``drivers``).

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
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, exc

from celery_saga.store.drivers.protocol import Counter, Params, Read, constants, on_cursor


@dataclass(frozen=True)
class Compiled:
    sql: str
    #: Values the statement carries itself (its literals, sent as parameters).
    constants: dict[str, Any]


@functools.lru_cache(maxsize=512)  # bounded: only statements built once should come here
def _compiled(statement: Any, engine: Engine) -> Compiled:
    compiled = statement.compile(dialect=engine.dialect)
    return Compiled(str(compiled), constants(compiled))


class Psycopg:
    """psycopg's ``Sender``: single statements only, in autocommit; inside a transaction
    (whose state SQLAlchemy keeps on the connection) SQLAlchemy runs them."""

    def __init__(self, own: Counter) -> None:
        self.own = own

    def steps_aside(self, connection: Connection) -> bool:
        return connection.in_transaction()

    def prepare(self, statement: Any, engine: Engine) -> Compiled:
        return _compiled(statement, engine)

    def send(self, connection: Connection, prepared: Compiled, params: Params, read: Read) -> Any:
        engine = connection.engine
        values = {**prepared.constants, **params}
        driver = connection.connection.dbapi_connection  # reconnects an invalidated one
        assert driver is not None
        dbapi = engine.dialect.loaded_dbapi
        try:
            if not driver.autocommit:
                driver.autocommit = True  # the mode single statements run in (database.py)
            return on_cursor(connection, self.own, prepared.sql, values, read)
        except dbapi.Error as error:
            dropped = bool(engine.dialect.is_disconnect(error, driver, None))
            if dropped:
                connection.invalidate(error)
            raise exc.DBAPIError.instance(
                prepared.sql,
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

    def mappings(self, cursor: Any, statement: Any, engine: Engine) -> list[dict[str, Any]]:
        return _mappings(cursor)


def _mappings(cursor: Any) -> list[dict[str, Any]]:
    rows = cursor.fetchall()
    if not rows:
        return []
    # Field names straight from the result: psycopg's ``description`` builds a column
    # object (with a type lookup) per field, which cost more than the rows themselves.
    result = cursor.pgresult
    names = [result.fname(index).decode() for index in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in rows]
