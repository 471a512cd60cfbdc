"""Engine set-up per backend, transactions, schema migrations and a statement counter."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from celery_saga.errors import StoreConfigurationError
from celery_saga.store import drivers, url_errors

VERSION_TABLE = "celery_saga_alembic_version"
_MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK = 0x5A6A_0001


def to_db_time(value: datetime) -> datetime:
    """Stored timestamps are naive UTC, the one form every backend keeps exactly."""
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def from_db_time(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=timezone.utc)


#: PostgreSQL settings of a sweep's read (``Database.read(serial=True)``).
SERIAL_PLAN = ("SET LOCAL max_parallel_workers_per_gather = 0",)
#: PostgreSQL settings of a keyset page's read (``Database.read(in_order=True)``).
KEYSET_PLAN = ("SET LOCAL enable_bitmapscan = off", "SET LOCAL enable_sort = off")

#: Execution option: this connection runs single statements, each committing on its own.
_AUTOCOMMIT = drivers.AUTOCOMMIT


#: ``PRAGMA synchronous`` values a SQLite store may run with (``saga_sqlite_synchronous``).
#: In WAL mode NORMAL syncs at checkpoints only: a commit survives a crash of the process,
#: not of the machine (power loss, kernel panic), which may undo the last commits. FULL
#: syncs the WAL at every commit; EXTRA syncs its directory too (docs/storage.md).
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


def checked_synchronous(value: Any) -> str:
    """The validated ``PRAGMA synchronous`` value (case-insensitive) of a setting."""
    chosen = str(value).upper()
    if chosen not in SQLITE_SYNCHRONOUS:
        choices = ", ".join(SQLITE_SYNCHRONOUS)
        raise StoreConfigurationError(
            f"saga_sqlite_synchronous must be one of {choices}, not {value!r}"
        )
    return chosen


def _retried_once(read: Callable[[], Sequence[Mapping[Any, Any]]]) -> Sequence[Mapping[Any, Any]]:
    """``read()``, again once if it met a connection the server dropped (no pre-ping)."""
    for attempt in (1, 2):
        try:
            return read()
        except DBAPIError as error:
            if attempt == 2 or not error.connection_invalidated:
                raise
    raise AssertionError("unreachable")


def _on_begin(connection: Connection) -> None:
    """Put the pooled connection in the mode its user asked for, only when it differs.

    The mode stays with the connection in the pool, so a worker's run of single statements
    pays nothing per checkout (MySQL drivers spend a round trip on every switch).
    """
    wanted = bool(connection.get_execution_options().get(_AUTOCOMMIT, False))
    driver = connection.connection.dbapi_connection
    if driver is None or connection.dialect.detect_autocommit_setting(driver) == wanted:
        return
    toggle = driver.autocommit
    if callable(toggle):  # pymysql and mysqlclient take a call, psycopg an attribute
        toggle(wanted)
    else:
        driver.autocommit = wanted


def _server_connect_args(parsed: URL) -> tuple[URL, dict[str, Any]]:
    """Connect arguments for a server backend; ``prepare_threshold`` (PostgreSQL) is taken
    out of the URL's query, as psycopg wants it as a number or None, never as text."""
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in parsed.query:
        # A host that drops packets must not hang a connect for minutes: the retry
        # budgets count in seconds (store/transient.py).
        connect_args["connect_timeout"] = 10
    raw = parsed.query.get("prepare_threshold")
    if raw is not None:
        value = raw[-1] if isinstance(raw, tuple) else raw
        # "none": never prepare, for a pooler that cannot keep prepared statements.
        connect_args["prepare_threshold"] = None if value.lower() in ("", "none") else int(value)
        parsed = parsed.difference_update_query(["prepare_threshold"])
    return parsed, connect_args


def _after_fork(reference: weakref.ref[Engine]) -> None:
    engine = reference()
    if engine is not None:
        # A prefork child must not reuse the parent's sockets (billiard forks after import).
        engine.dispose(close=False)


class Database:
    """One SQLAlchemy engine (one connection pool) for the store, configured for its backend.

    A worker process holds at most two connections of it: the task's, and the lease
    heartbeat's while a body runs. Single statements run in autocommit on a connection of the
    same pool (``single_statement``); transactions switch it back (``_on_begin``). Inside
    ``task_connection()`` every statement of the task reuses one checked-out connection.
    """

    def __init__(self, url: str, *, sqlite_synchronous: str = "NORMAL") -> None:
        parsed = url_errors.parse(url)
        self.url = url
        self.dialect = parsed.get_backend_name()
        self.statement_count = 0
        #: Claims wait for their WAL flush like every other write (``saga_durable_claims``);
        #: otherwise a PostgreSQL claim commits without waiting (see docs/execution-model.md).
        self.durable_claims = self.dialect != "postgresql"
        #: One connection shared by every thread (in-memory SQLite): no concurrent users.
        self.single_connection = False
        #: A read replica of this store, for operators' reads (``replica.reads``).
        self.replica: Database | None = None
        options: dict[str, Any] = {"future": True}
        if self.dialect == "sqlite":
            options["connect_args"] = {"timeout": 30, "check_same_thread": False}
            if parsed.database in (None, "", ":memory:"):
                options["poolclass"] = StaticPool
                self.single_connection = True
        else:
            parsed, connect_args = _server_connect_args(parsed)
            # Every conditional write re-reads committed rows; REPEATABLE READ (MySQL's
            # default) would show a join an old snapshot of its sibling steps.
            options.update(
                isolation_level="READ COMMITTED", pool_recycle=1800, connect_args=connect_args
            )
        try:
            self.engine = create_engine(parsed, **options)
        except NoSuchModuleError:
            raise url_errors.unknown_dialect(parsed) from None
        except ImportError as error:  # the driver the URL names is not installed
            raise url_errors.quieted(url_errors.driver_missing(parsed, error), error) from None
        if self.dialect == "sqlite":
            drivers.configure_sqlite(self.engine, checked_synchronous(sqlite_synchronous))
        else:
            event.listen(self.engine, "begin", _on_begin)
        self._counter = self._count
        # retval: registered as it is (not wrapped), so a driver can tell it from others.
        event.listen(self.engine, "before_cursor_execute", self._counter, retval=True)
        drivers.use(self.engine, drivers.choose(self.engine, self._counter))
        reference = weakref.ref(self.engine)
        os.register_at_fork(after_in_child=lambda: _after_fork(reference))
        self._migrated = False
        self._migrate_lock = threading.Lock()
        #: The connection ``task_connection()`` checked out for this thread (or greenlet).
        self._held: ContextVar[list[Connection] | None] = ContextVar(
            "celery_saga_held", default=None
        )

    def _count(
        self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any
    ) -> tuple[str, Any]:
        if not str(statement).lstrip().upper().startswith(("BEGIN", "PRAGMA")):
            self.statement_count += 1
        return statement, parameters

    @contextmanager
    def task_connection(self) -> Iterator[None]:
        """Use one connection for everything the calling task does on this thread: a pool
        checkout and its return cost more CPU than a hot-path statement. It is checked out
        at the first statement (a store outage fails there, inside the caller's retries) and
        returned at the end. Nested calls keep the per-statement checkout."""
        if self.single_connection or self._held.get() is not None:
            yield
            return
        slot: list[Connection] = []
        token = self._held.set(slot)
        try:
            yield
        finally:
            self._held.reset(token)
            for connection in slot:
                connection.close()

    @property
    def driver(self) -> drivers.Driver:
        """How this store's statements built once run (``drivers``), chosen at start."""
        return drivers.of(self.engine)

    def _idle_held(self) -> Connection | None:
        """The task's connection (checked out now if need be) when no statement or
        transaction is open on it; None outside ``task_connection()``."""
        slot = self._held.get()
        if slot is None:
            return None
        if not slot:
            slot.append(self.engine.connect().execution_options(**{_AUTOCOMMIT: True}))
        return None if slot[0].in_transaction() else slot[0]

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        held = self._idle_held()
        if held is None:
            with self.engine.begin() as connection:
                yield connection
            return
        held.execution_options(**{_AUTOCOMMIT: False})
        try:
            with held.begin():
                yield held
        finally:
            held.execution_options(**{_AUTOCOMMIT: True})

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        """A connection for exactly one statement, which commits on its own (autocommit):
        against a server that saves the round trips of BEGIN and COMMIT; on SQLite the lock
        a write statement needs is taken when it starts, waiting out the busy timeout (only
        a transaction that reads before it writes can fail to upgrade, which is why
        ``transaction`` begins IMMEDIATE), and a read takes no write lock at all."""
        held = self._idle_held()
        if held is not None:
            try:
                yield held
            finally:
                held.rollback()  # ends SQLAlchemy's autobegun block; nothing is sent
        elif self.single_connection:  # in-memory SQLite: one connection, used in turn
            with self.transaction() as connection:
                yield connection
        else:
            with self.engine.connect() as connection:
                yield connection.execution_options(**{_AUTOCOMMIT: True})

    def read(
        self,
        query: Any,
        params: dict[str, Any] | None = None,
        *,
        serial: bool = False,
        in_order: bool = False,
    ) -> Sequence[Mapping[Any, Any]]:
        """Run one read; retried once on a connection the server dropped (no pre-ping).
        With ``params``, ``query`` is a statement built once (``drivers.rows``).

        ``serial``: a sweep's read, on PostgreSQL planned without parallel workers. A sweep
        reads the few rows due; on a big table the planner may still split it over workers,
        whose start costs more than the read (the recovery sweep at 3M runs: 11 ms, not 0.5).

        ``in_order``: a keyset page (``run_selection``), on PostgreSQL planned to walk an
        index in the page's order (``KEYSET_PLAN``) rather than gather every match and sort
        it: a first page of a common label and a rarer state read 400,000 buffers at 1M runs
        otherwise (``benchmarks/run_selection.py``).
        """
        settings = (SERIAL_PLAN if serial else ()) + (KEYSET_PLAN if in_order else ())
        if settings and self.dialect == "postgresql":

            def once() -> Sequence[Mapping[Any, Any]]:
                with self.transaction() as connection:
                    for setting in settings:
                        connection.execute(text(setting))
                    return connection.execute(query).mappings().all()

        else:

            def once() -> Sequence[Mapping[Any, Any]]:
                with self.single_statement() as connection:
                    if params is not None:
                        return drivers.rows(connection, query, params)
                    return connection.execute(query).mappings().all()

        return _retried_once(once)

    def migrate(self) -> None:
        """Bring the schema to the newest revision; safe to call from many processes."""
        if self._migrated:  # every public call checks: no lock once it is done
            return
        with self._migrate_lock:
            if self._migrated:
                return
            from alembic import command
            from alembic.config import Config

            from celery_saga.store import schema

            config = Config()
            config.set_main_option("script_location", str(_MIGRATIONS))
            config.set_main_option("version_table", VERSION_TABLE)
            alembic_logger = logging.getLogger("alembic")
            level = alembic_logger.level
            alembic_logger.setLevel(max(level, logging.WARNING))  # one line per plugin otherwise
            try:
                with self.engine.begin() as connection, self.migration_lock(connection):
                    config.attributes["connection"] = connection
                    before = schema.revision_on(connection)
                    command.upgrade(config, "head")
                    after = schema.revision_on(connection)
            finally:
                alembic_logger.setLevel(level)
            schema.log_change(before, after)  # once, and only when the schema moved
            self._migrated = True

    @contextmanager
    def migration_lock(self, connection: Connection) -> Iterator[None]:
        """One migrating process per database. PostgreSQL's lock ends with the transaction;
        MySQL's named lock belongs to the session and to the whole server, so it is named
        after the database and released even when the upgrade fails (a pooled connection
        that kept it would make every other process wait out the timeout)."""
        if self.dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        if self.dialect not in ("mysql", "mariadb"):
            yield
            return
        name = f"celery_saga_migrate:{make_url(self.url).database}"[:64]
        got = connection.execute(text("SELECT GET_LOCK(:name, 120)"), {"name": name}).scalar()
        if got != 1:
            raise RuntimeError(f"could not take the migration lock {name!r} within 120 s")
        try:
            yield
        finally:
            connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})

    def dispose(self) -> None:
        self.engine.dispose()
        if self.replica is not None:
            self.replica.dispose()
