"""One connection pool per process: single statements in autocommit and transactions share
it, and neither leaks its mode into the other."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Column, MetaData, String, Table, event, insert, select, text
from sqlalchemy.exc import DBAPIError

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
