"""Each store picks its statement strategy once, when its ``Database`` is built, from the
driver its URL names; the store's statements then find it by their connection's engine."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from celery_saga.store import drivers
from celery_saga.store.database import Database
from celery_saga.store.drivers.direct import Direct
from celery_saga.store.drivers.postgres import Psycopg
from celery_saga.store.drivers.sqlite import Sqlite3


@pytest.mark.parametrize(
    ("url", "sender"),
    [
        ("sqlite://", Sqlite3),
        ("postgresql+psycopg://postgres@127.0.0.1:5432/nowhere", Psycopg),
        ("mysql+pymysql://root@127.0.0.1:3306/nowhere", None),
    ],
)
def test_the_strategy_follows_the_driver_the_url_names(url: str, sender: type | None) -> None:
    db = Database(url)  # no connection is made
    try:
        if sender is None:
            assert db.driver is drivers.ALCHEMY
        else:
            assert isinstance(db.driver, Direct) and isinstance(db.driver.sender, sender)
        assert drivers.of(db.engine) is db.driver
    finally:
        db.dispose()


def test_an_engine_the_store_did_not_build_runs_through_sqlalchemy() -> None:
    engine = create_engine("sqlite://")
    try:
        assert drivers.of(engine) is drivers.ALCHEMY
    finally:
        engine.dispose()
