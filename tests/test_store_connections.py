"""One connection pool per process: single statements in autocommit and transactions share
it, and neither leaks its mode into the other."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Column, MetaData, String, Table, insert, select, text

from celery_saga.store.database import Database
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
