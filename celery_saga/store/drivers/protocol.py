"""What every statement strategy offers, and the one test that makes a direct one step aside."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Engine

Rows = Sequence[Mapping[Any, Any]]

#: Parameters of a statement, by name.
Params = dict[str, Any]
#: What a direct strategy reads from the cursor once its statement ran.
Read = Callable[[Any], Any]

#: Execution option: this connection runs single statements, each committing on its own.
AUTOCOMMIT = "saga_autocommit"

#: The store's own statement counter (``Database._count``), a ``before_cursor_execute``
#: listener: a direct strategy calls it for each statement it sends, as SQLAlchemy would.
Counter = Callable[..., Any]

#: Events that see or change statement execution: with a listener on any (but the store's
#: own counter), SQLAlchemy must run the statement so that the listener sees it.
_ENGINE_EVENTS = ("before_cursor_execute", "after_cursor_execute")
_DIALECT_EVENTS = ("do_execute", "do_execute_no_params", "handle_error")


class Driver(Protocol):
    """A way to run a statement built once (with bind parameters) on a store connection."""

    def direct(self, connection: Connection) -> bool:
        """Whether a statement on ``connection`` now bypasses SQLAlchemy's execution."""
        ...

    def rowcount(self, connection: Connection, statement: Any, params: dict[str, Any]) -> int:
        """Run one write; the rows it changed."""
        ...

    def rows(self, connection: Connection, statement: Any, params: dict[str, Any]) -> Rows:
        """Run one statement that returns rows; each row maps column key to value."""
        ...


def observed(engine: Engine, own: Counter) -> bool:
    """Whether anyone but ``own`` (the store's statement counter) listens to statements.

    Asked before every statement, so written as plain loops: no generator to resume per
    listener (usually one, the counter)."""
    dispatch = engine.dispatch
    for name in _ENGINE_EVENTS:
        for listener in getattr(dispatch, name):
            if listener != own:
                return True
    dialect = engine.dialect.dispatch
    for name in _DIALECT_EVENTS:
        for listener in getattr(dialect, name, ()):
            if listener != own:
                return True
    return False


def on_cursor(
    connection: Connection,
    own: Counter,
    sql: str,
    values: Any,
    read: Callable[[Any], Any],
) -> Any:
    """Run ``sql`` on a cursor of the driver's own connection, counted by ``own`` as
    SQLAlchemy would count it; ``read(cursor)`` is the result."""
    driver = connection.connection.dbapi_connection  # reconnects an invalidated one
    assert driver is not None
    cursor = driver.cursor()
    try:
        own(connection, cursor, sql, values, None, False)
        cursor.execute(sql, values)
        return read(cursor)
    finally:
        cursor.close()


def constants(compiled: Any) -> dict[str, Any]:
    """Values a compiled statement carries itself (its literals, sent as parameters)."""
    return {
        name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required
    }
