"""The hot path's statements on SQLite go to sqlite3 directly, in and out of transactions,
and behave as through SQLAlchemy: the same rows with the same types, SQLAlchemy's
exceptions, a rollback that undoes them; a statement listener makes SQLAlchemy run them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Column, MetaData, String, Table, event, insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from celery_saga import Saga, SagaEngine
from celery_saga.store import drivers, queries
from celery_saga.store.database import Database
from celery_saga.store.transient import is_transient
from celery_saga.worker.embedded import embedded_worker

_probe = Table("test_direct_probe", MetaData(), Column("tag", String(40), primary_key=True))


@pytest.fixture
def db(tmp_path: Path) -> Any:
    database = Database(f"sqlite:///{tmp_path}/store.sqlite3")
    _probe.create(database.engine)
    yield database
    database.dispose()


def _tags(db: Database) -> list[str]:
    return [row["tag"] for row in db.read(select(_probe))]


def test_direct_writes_count_rows_commit_alone_and_roll_back_in_a_transaction(
    db: Database,
) -> None:
    before = db.statement_count
    with db.task_connection():
        with db.single_statement() as connection:
            assert db.driver.direct(connection)
            assert drivers.rowcount(connection, insert(_probe), {"tag": "kept"}) == 1
        with pytest.raises(RuntimeError), db.transaction() as connection:
            assert db.driver.direct(connection)
            assert drivers.rowcount(connection, insert(_probe), {"tag": "undone"}) == 1
            raise RuntimeError("roll back")
        with db.single_statement() as connection:
            rows = drivers.rows(connection, select(_probe), {})
    assert [dict(row) for row in rows] == [{"tag": "kept"}]
    assert db.statement_count - before == 3  # counted as SQLAlchemy would count them
    assert _tags(db) == ["kept"]


def test_direct_errors_are_sqlalchemy_errors(db: Database, tmp_path: Path) -> None:
    with db.single_statement() as connection:
        drivers.rowcount(connection, insert(_probe), {"tag": "once"})
    with pytest.raises(IntegrityError), db.single_statement() as connection:
        drivers.rowcount(connection, insert(_probe), {"tag": "once"})
    with db.engine.connect() as connection:  # the pool's one connection: a short timeout
        connection.exec_driver_sql("PRAGMA busy_timeout=50")
    other = sqlite3.connect(tmp_path / "store.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    try:
        with pytest.raises(DBAPIError) as caught, db.single_statement() as connection:
            drivers.rowcount(connection, insert(_probe), {"tag": "blocked"})
        assert is_transient(caught.value)
    finally:
        other.rollback()
        other.close()


def test_a_statement_listener_sees_every_statement(db: Database) -> None:
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    with db.single_statement() as connection:
        assert not db.driver.direct(connection)
        assert drivers.rowcount(connection, insert(_probe), {"tag": "seen"}) == 1
        assert drivers.rows(connection, select(_probe), {})
    assert [s.split()[0] for s in seen] == ["INSERT", "SELECT"]


def _count(obj: list[int]) -> int:
    return len(obj)


def test_a_run_read_directly_equals_the_same_read_through_sqlalchemy(tmp_path: Path) -> None:
    app = Celery("direct-sqlite", broker="memory://localhost/", set_as_current=False)
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/runs.sqlite3")
    engine.register(
        Saga("pair").step("first", lambda: {"n": 1}, compensate=lambda: None).step("second", _count)
    )
    engine.ensure_schema()
    with embedded_worker(app):
        run = engine.start("pair", {"obj": [1, 2]}).wait(timeout=30)
    assert run.state.value == "completed"
    query, params = queries._snapshot_by_id(), {"run_id": run.id}
    direct = [dict(row) for row in engine.db.read(query, params)]
    event.listen(engine.db.engine, "before_cursor_execute", lambda *args: None)
    through_sqlalchemy = [dict(row) for row in engine.db.read(query, params)]
    engine.db.dispose()
    assert len(direct) == 2 and direct == through_sqlalchemy

    def types(rows: list[dict[str, Any]]) -> list[dict[str, type]]:
        return [{key: type(value) for key, value in row.items()} for row in rows]

    assert types(direct) == types(through_sqlalchemy)  # True is not 1, a datetime no text
    assert {type(value) for row in direct for value in row.values()} >= {str, int, bytes}
    stamps = [row[key] for row in direct for key in row if key.endswith("started_at")]
    assert stamps and all(stamp.year == time.gmtime().tm_year for stamp in stamps)


def _fails() -> None:
    raise RuntimeError("the last step fails on purpose")


def test_reversals_and_signals_write_to_sqlite3_directly(tmp_path: Path) -> None:
    """The failure that starts an unwind, a reversal's claim and outcome, a signal, the park
    and the resume at a gate: none of their writes runs through SQLAlchemy's
    ``Connection.execute`` (each is built once and sent to sqlite3)."""
    app = Celery("direct-sqlite-unwind", broker="memory://localhost/", set_as_current=False)
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/unwind.sqlite3")
    unwinding = Saga("unwinding").step("s1", lambda: None, compensate=lambda: None)
    engine.register(unwinding.step("s2", lambda: None, compensate=lambda: None).step("s3", _fails))
    engine.register(Saga("gated").step("a", lambda: None).wait_for("go").step("b", lambda: None))
    engine.ensure_schema()
    through_sqlalchemy: list[list[str]] = []
    event.listen(
        engine.db.engine,
        "before_execute",
        lambda _connection, clause, *_: through_sqlalchemy.append(str(clause).split()[0:3]),
    )
    with embedded_worker(app):
        failed = engine.start("unwinding", {}).wait(timeout=30)
        gated = engine.start("gated", {})
        deadline = time.monotonic() + 30
        while engine.get(gated.id).state.value != "waiting" and time.monotonic() < deadline:
            time.sleep(0.02)
        engine.signal(gated.id, "go")
        passed = gated.wait(timeout=30)
    engine.db.dispose()
    assert failed.state.value == "failed" and passed.state.value == "completed"
    assert [s.compensation_status for s in failed.steps][:2] == ["compensated"] * 2
    writes = [words for words in through_sqlalchemy if words[0] in ("INSERT", "UPDATE")]
    # Once per version and process, not per run: where a version is seen, and its shape.
    once = {"saga_versions", "saga_version_shapes"}
    own = [words for words in writes if not once & set(words)]
    assert own == [], own
