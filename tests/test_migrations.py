"""The shipped migrations build exactly the tables the code uses, and upgrade a store that
holds runs without losing them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, insert, text

from celery_saga.records import ExecutionState
from celery_saga.store import queries
from celery_saga.store.codec import pack
from celery_saga.store.database import _MIGRATIONS, VERSION_TABLE, Database
from celery_saga.store.tables import executions, metadata
from tests.conftest import _MARIADB_SHARED, PG_ADMIN, PORTS, require_services


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def empty_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own, created empty for the test and dropped after it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/migrate.sqlite3"
        return
    name = f"saga_migrate_{uuid.uuid4().hex[:8]}"
    if request.param == "postgres":
        require_services(PORTS["postgres"])
        admin_url, url = PG_ADMIN, PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    else:
        require_services(3306)
        # the shared database: this process's own may not exist yet
        admin_url = _MARIADB_SHARED
        url = _MARIADB_SHARED.rsplit("/", 1)[0] + "/" + name
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()


def _upgrade(db: Database, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("version_table", VERSION_TABLE)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def test_the_migrated_schema_is_the_schema_the_code_uses(empty_store: str) -> None:
    db = Database(empty_store)
    db.migrate()
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        differences = [
            d
            for d in compare_metadata(context, metadata)
            if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)
        ]
    assert differences == []
    db.dispose()


def test_upgrading_a_store_that_holds_runs_keeps_them(empty_store: str) -> None:
    db = Database(empty_store)
    _upgrade(db, "0001")
    stamp = datetime(2030, 1, 1)
    with db.engine.begin() as connection:  # the columns saga_executions had at 0001
        connection.execute(
            insert(executions).values(
                id="old-run",
                saga_name="order",
                definition_hash="h",
                state=ExecutionState.RUNNING.value,
                cursor=1,
                cursor_sub=0,
                input=pack({"order": 1}),
                created_at=stamp,
                updated_at=stamp,
                version=1,
            )
        )
    db.migrate()
    kept = queries.load_execution(db, "old-run")
    assert kept is not None and kept.input == {"order": 1} and kept.wake_at is None
    queries.create_execution(
        db,
        execution_id="new-run",
        saga_name="order",
        definition_hash="h",
        input_blob=pack({}),
        node=0,
        sub=0,
        state=ExecutionState.RUNNING,
        committed=False,
        now=datetime.now(timezone.utc),
    )
    assert queries.load_execution(db, "new-run") is not None
    db.dispose()


def _indexes(db: Database) -> set[str]:
    from sqlalchemy import inspect

    with db.engine.connect() as connection:
        return {i["name"] for i in inspect(connection).get_indexes("saga_executions")}


def test_downgrading_the_hot_update_indexes_and_upgrading_again_round_trips(
    empty_store: str,
) -> None:
    db = Database(empty_store)
    db.migrate()
    assert "ix_saga_executions_state" not in _indexes(db)
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("version_table", VERSION_TABLE)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    downgraded = _indexes(db)
    assert "ix_saga_executions_state" in downgraded
    assert "ix_saga_executions_state_created" not in downgraded
    _upgrade(db, "head")
    assert "ix_saga_executions_state_created" in _indexes(db)
    db.dispose()


def test_a_failed_upgrade_leaves_no_migration_lock_behind(
    empty_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(empty_store)

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the upgrade broke half way")

    monkeypatch.setattr(command, "upgrade", broken)
    with pytest.raises(RuntimeError, match="half way"):
        db.migrate()
    monkeypatch.undo()
    # Another process (another pool) migrates at once: it is not made to wait for a lock
    # the failed one kept on its pooled connection.
    other = Database(empty_store)
    started = datetime.now(timezone.utc)
    other.migrate()
    assert (datetime.now(timezone.utc) - started).total_seconds() < 10
    db.dispose()
    other.dispose()
