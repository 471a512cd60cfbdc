"""One connection pool per process: single statements in autocommit and transactions share
it, and neither leaks its mode into the other."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Column, MetaData, String, Table, event, insert, select, text
from sqlalchemy.exc import DBAPIError

from celery_saga import SagaEngine
from celery_saga.errors import StoreConfigurationError
from celery_saga.store.database import Database
from celery_saga.store.transient import is_transient
from tests.conftest import PORTS, _test_database_url, require_services

_probe = Table("test_connection_probe", MetaData(), Column("tag", String(40), primary_key=True))


def _tags(db: Database) -> set[str]:
    return {row["tag"] for row in db.read(select(_probe))}


def test_single_statements_and_transactions_share_one_connection(store_url: str) -> None:
    db = Database(store_url)
    _probe.create(db.engine, checkfirst=True)
    kept, undone = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        with db.single_statement() as connection:  # no commit: autocommit keeps it
            connection.execute(insert(_probe).values(tag=kept))
        with pytest.raises(RuntimeError), db.transaction() as connection:
            connection.execute(insert(_probe).values(tag=undone))
            raise RuntimeError("roll back")  # a transaction after autocommit still rolls back
        with db.engine.connect() as connection:  # any other user gets a transaction too
            connection.execute(insert(_probe).values(tag=undone))
            connection.rollback()
        assert kept in _tags(db) and undone not in _tags(db)
        # Sequential users of every kind reused one pooled connection.
        assert db.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    finally:
        with db.transaction() as connection:
            connection.execute(_probe.delete().where(_probe.c.tag == kept))
        db.dispose()


def test_prepare_threshold_in_the_url_reaches_the_driver() -> None:
    require_services(PORTS["postgres"])
    url = _test_database_url()
    for option, expected in (("none", None), ("0", 0), (None, 5)):
        db = Database(url if option is None else f"{url}?prepare_threshold={option}")
        with db.single_statement() as connection:
            connection.execute(text("SELECT 1"))
            assert connection.connection.dbapi_connection.prepare_threshold == expected  # type: ignore[union-attr]
        db.dispose()


def test_a_task_connection_serves_statements_and_transactions_alike(store_url: str) -> None:
    db = Database(store_url)
    _probe.create(db.engine, checkfirst=True)
    kept, undone = uuid.uuid4().hex, uuid.uuid4().hex
    checkouts: list[object] = []
    event.listen(db.engine, "checkout", lambda *args: checkouts.append(args))
    try:
        with db.task_connection():
            with db.single_statement() as connection:
                connection.execute(insert(_probe).values(tag=kept))
                if db.dialect != "sqlite":  # (SQLite: one writer at a time)
                    with db.single_statement() as inner:  # one is open: another connection
                        assert inner is not connection
            with pytest.raises(RuntimeError), db.transaction() as connection:
                connection.execute(insert(_probe).values(tag=undone))
                raise RuntimeError("roll back")
            assert kept in _tags(db) and undone not in _tags(db)
        if db.dialect != "sqlite":
            assert len(checkouts) == 2  # the task's connection, and the nested statement's
        assert kept in _tags(db)  # committed on its own, not with the task's end
    finally:
        with db.transaction() as connection:
            connection.execute(_probe.delete().where(_probe.c.tag == kept))
        db.dispose()


def test_a_task_connection_the_server_dropped_is_replaced() -> None:
    require_services(PORTS["postgres"])
    db = Database(_test_database_url())
    killer = Database(_test_database_url())
    try:
        with db.task_connection():
            pid = db.read(text("SELECT pg_backend_pid() AS pid"))[0]["pid"]
            with killer.single_statement() as connection:
                connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as caught, db.single_statement() as connection:
                connection.execute(text("SELECT 1"))
            assert is_transient(caught.value)
            with db.single_statement() as connection:  # the next one reconnects
                assert connection.execute(text("SELECT 1")).scalar() == 1
            with db.transaction() as connection:
                assert connection.execute(text("SELECT 2")).scalar() == 2
    finally:
        db.dispose()
        killer.dispose()


def _sqlite_writer_holding_the_lock(path: Path) -> sqlite3.Connection:
    """Another process's view: a connection of its own in the middle of a write."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_sqlite_single_statements_do_not_queue_behind_a_writer(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/store.sqlite3")
    _probe.create(db.engine)
    with db.single_statement() as connection:
        connection.execute(insert(_probe).values(tag="before"))
    other = _sqlite_writer_holding_the_lock(tmp_path / "store.sqlite3")
    try:
        started = time.monotonic()
        assert _tags(db) == {"before"}  # a read takes no write lock: no wait for the writer
        with db.task_connection():
            assert _tags(db) == {"before"}
        assert time.monotonic() - started < 1  # the busy timeout is 30 s
    finally:
        other.rollback()
        other.close()
        db.dispose()


def test_sqlite_transaction_waiting_out_the_lock_fails_as_a_transient_error(
    tmp_path: Path,
) -> None:
    db = Database(f"sqlite:///{tmp_path}/store.sqlite3")
    _probe.create(db.engine)
    with db.engine.connect() as connection:  # the pool's one connection: a short timeout
        connection.exec_driver_sql("PRAGMA busy_timeout=50")
    other = _sqlite_writer_holding_the_lock(tmp_path / "store.sqlite3")
    try:
        with pytest.raises(DBAPIError) as caught, db.transaction() as connection:
            connection.execute(insert(_probe).values(tag="blocked"))
        assert is_transient(caught.value)  # retried by the engine like any busy database
    finally:
        other.rollback()
        other.close()
    with db.transaction() as connection:  # the lock is free: BEGIN IMMEDIATE goes through
        connection.execute(insert(_probe).values(tag="after"))
    assert _tags(db) == {"after"}
    db.dispose()


@pytest.mark.parametrize(("setting", "pragma"), [("NORMAL", 1), ("full", 2), ("EXTRA", 3)])
def test_sqlite_synchronous_setting_reaches_every_connection(
    tmp_path: Path, setting: str, pragma: int
) -> None:
    db = Database(f"sqlite:///{tmp_path}/store.sqlite3", sqlite_synchronous=setting)
    with db.single_statement() as connection:
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == pragma
    db.dispose()


def test_sqlite_synchronous_setting_refuses_what_could_lose_the_file(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigurationError, match="NORMAL, FULL, EXTRA"):
        Database(f"sqlite:///{tmp_path}/store.sqlite3", sqlite_synchronous="OFF")


def test_sqlite_synchronous_comes_from_the_app_setting(tmp_path: Path) -> None:
    app = Celery("synchronous", broker="memory://localhost/", set_as_current=False)
    app.conf.saga_sqlite_synchronous = "FULL"
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")
    with engine.db.single_statement() as connection:
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    engine.db.dispose()
