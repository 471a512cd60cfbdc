"""The hot path's statements on PostgreSQL go to psycopg directly, and behave as through
SQLAlchemy: same rows, SQLAlchemy's exceptions, a dropped connection invalidated and then
replaced; anyone listening to the engine's statements (a tracing integration) still sees
every statement, because SQLAlchemy then runs them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, event, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from celery_saga.store import drivers
from celery_saga.store.database import Database
from celery_saga.store.transient import is_transient
from tests.conftest import PORTS, _test_database_url, require_services

_probe = Table("test_direct_probe", MetaData(), Column("tag", String(40), primary_key=True))


@pytest.fixture
def db() -> Any:
    require_services(PORTS["postgres"])
    database = Database(_test_database_url())
    _probe.create(database.engine, checkfirst=True)
    yield database
    with database.transaction() as connection:
        connection.execute(_probe.delete())
    database.dispose()


def test_direct_writes_count_rows_and_commit_on_their_own(db: Database) -> None:
    tag = uuid.uuid4().hex
    before = db.statement_count
    with db.task_connection():
        with db.single_statement() as connection:
            assert db.driver.direct(connection)
            assert drivers.rowcount(connection, insert(_probe), {"tag": tag}) == 1
        with db.single_statement() as connection:
            rows = drivers.rows(connection, select(_probe).where(_probe.c.tag == tag), {})
    assert [dict(row) for row in rows] == [{"tag": tag}]
    assert db.statement_count - before == 2  # counted as SQLAlchemy would count them
    assert [row["tag"] for row in db.read(select(_probe))] == [tag]  # committed


def test_direct_errors_are_sqlalchemy_errors(db: Database) -> None:
    tag = uuid.uuid4().hex
    with db.single_statement() as connection:
        drivers.rowcount(connection, insert(_probe), {"tag": tag})
    with pytest.raises(IntegrityError), db.single_statement() as connection:
        drivers.rowcount(connection, insert(_probe), {"tag": tag})


def test_a_dropped_connection_is_invalidated_then_replaced(db: Database) -> None:
    killer = Database(_test_database_url())
    try:
        with db.task_connection():
            with db.single_statement() as connection:
                pid = drivers.rows(connection, text("SELECT pg_backend_pid() AS pid"), {})[0]["pid"]
            with killer.single_statement() as connection:
                connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as caught, db.single_statement() as connection:
                drivers.rowcount(connection, insert(_probe), {"tag": uuid.uuid4().hex})
            assert caught.value.connection_invalidated and is_transient(caught.value)
            with db.single_statement() as connection:
                assert drivers.rowcount(connection, insert(_probe), {"tag": uuid.uuid4().hex}) == 1
    finally:
        killer.dispose()


def test_a_statement_listener_sees_every_statement(db: Database) -> None:
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    with db.single_statement() as connection:
        assert not db.driver.direct(connection)
        write = text("INSERT INTO test_direct_probe (tag) VALUES (:tag)")
        assert drivers.rowcount(connection, write, {"tag": uuid.uuid4().hex}) == 1
        assert drivers.rows(connection, select(_probe), {})
    assert [s.split()[0] for s in seen] == ["INSERT", "SELECT"]
