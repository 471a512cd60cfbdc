"""Per-step updates of the run row are HOT on PostgreSQL: no index holds a column that every
step changes, so an update rewrites the row in place instead of every index entry."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from sqlalchemy import Engine, create_engine, func, select, text

from celery_saga import Saga, SagaEngine
from celery_saga.store.tables import executions
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import PORTS, _test_database_url, require_services

RUNS = 200
STEPS = 5


def _noop() -> None:
    return None


def _updates(observer: Engine) -> tuple[int, int]:
    with observer.connect() as connection:
        connection.execute(text("SELECT pg_stat_clear_snapshot()"))
        row = connection.execute(
            text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'saga_executions'"
            )
        ).one()
    return int(row[0]), int(row[1])


def _settled_updates(observer: Engine, at_least: int) -> tuple[int, int]:
    """Counters once the workers' backends (closed by the caller) have reported them."""
    deadline = time.monotonic() + 15
    seen = _updates(observer)
    while seen[0] < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = _updates(observer)
    return seen


@pytest.fixture
def observer() -> Iterator[Engine]:
    require_services(PORTS["postgres"])
    engine = create_engine(_test_database_url())
    yield engine
    engine.dispose()


def test_most_run_row_updates_of_a_happy_path_are_hot(observer: Engine) -> None:
    app = Celery(f"hot-{uuid.uuid4().hex[:6]}", broker="memory://localhost/", set_as_current=False)
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    app.conf.task_default_queue = app.main
    engine = SagaEngine(app, store_url=_test_database_url())
    saga = Saga(f"hot{uuid.uuid4().hex[:6]}")
    for index in range(STEPS):
        saga.step(f"s{index}", _noop)
    engine.register(saga)
    engine.ensure_schema()
    # Earlier tests leave the table's pages full of dead row versions that autovacuum has not
    # cleared yet, and an update is HOT only with room on its page: start from what
    # autovacuum keeps in production, not from whatever the tests before left behind.
    with observer.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM saga_executions"))
    updates_before, hot_before = _settled_updates(observer, 0)
    with embedded_worker(app, concurrency=4):
        ids = [engine.start(saga.name, {}).id for _ in range(RUNS)]
        deadline = time.monotonic() + 120
        while True:
            with observer.connect() as connection:
                done = connection.execute(
                    select(func.count())
                    .select_from(executions)
                    .where(executions.c.id.in_(ids), executions.c.state == "completed")
                ).scalar_one()
            if done == RUNS:
                break
            assert time.monotonic() < deadline, f"{done} of {RUNS} runs completed"
            time.sleep(0.1)
    engine.db.dispose()  # a backend reports its table counters when it exits
    updates_after, hot_after = _settled_updates(observer, updates_before + RUNS * STEPS)
    updates, hot = updates_after - updates_before, hot_after - hot_before
    print(f"saga_executions: {updates} updates, {hot} HOT ({hot / max(updates, 1):.0%})")
    assert updates >= RUNS * STEPS
    # Only the update that ends a run changes an indexed column (its state), so every other
    # one may be HOT. Whether it is also needs room on the row's page, which depends on when
    # PostgreSQL prunes it: 772 to 800 of the 800 were seen, an indexed column changed by
    # every step would make it none.
    assert hot >= 0.9 * (updates - RUNS)
