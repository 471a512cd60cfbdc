"""Happy-path cost: statements and pool checkouts per node, counted (not timed).

PostgreSQL takes at most three per sequential node: claim the step (START record), read the
run if the step needs its input or earlier results, record the outcome, move the cursor and
add the attempt's history row in one statement. MySQL/MariaDB add that row in a statement
of its own (at most four), and SQLite, in-process (no network round trip), records the
outcome in three statements. These no-argument steps need no read. On a server every
statement of a node's task shares one connection checked out of the pool once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import create_engine, event, select

from celery_saga import Saga, SagaEngine
from celery_saga.store.tables import executions
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import PORTS, _test_database_url, mariadb_url, require_services

STEPS = 5


def _noop() -> None:
    return None


def _count_statements(store_url: str) -> int:
    return _count(store_url)[0]


def _count(store_url: str) -> tuple[int, int]:
    """Statements and pool checkouts of one run, without the start's own."""
    app = Celery(
        f"count-{uuid.uuid4().hex[:6]}", broker="memory://localhost/", set_as_current=False
    )
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    app.conf.task_default_queue = app.main  # its own queue: other apps' messages stay out
    engine = SagaEngine(app, store_url=store_url)
    saga = Saga(f"noop{uuid.uuid4().hex[:6]}")
    for index in range(STEPS):
        saga.step(f"s{index}", _noop)
    engine.register(saga)
    engine.ensure_schema()
    observer = create_engine(store_url)
    checkouts: list[object] = []
    event.listen(engine.db.engine, "checkout", lambda *args: checkouts.append(args))
    with embedded_worker(app, concurrency=1):
        before = engine.db.statement_count
        run = engine.start(saga.name, {})
        del checkouts[:]  # the start's own (the run's INSERT)
        deadline = time.monotonic() + 30
        while True:
            with observer.connect() as connection:
                state = connection.execute(
                    select(executions.c.state).where(executions.c.id == run.id)
                ).scalar_one()
            if state == "completed":
                break
            assert time.monotonic() < deadline, "run did not complete"
            time.sleep(0.02)
        used = engine.db.statement_count - before
        used_checkouts = len(checkouts)
    observer.dispose()
    return used - 1, used_checkouts  # minus the INSERT that created the run


def test_postgres_happy_path_takes_at_most_three_statements_per_node() -> None:
    require_services(PORTS["postgres"])
    assert _count_statements(_test_database_url()) <= 3 * STEPS


def test_mariadb_happy_path_takes_at_most_four_statements_per_node() -> None:
    require_services(3306)
    url = mariadb_url()
    assert _count_statements(url) <= 4 * STEPS


def test_sqlite_happy_path_takes_at_most_five_statements_per_node(tmp_path: Path) -> None:
    assert _count_statements(f"sqlite:///{tmp_path}/count.sqlite3") <= 5 * STEPS


def test_postgres_node_checks_out_one_connection() -> None:
    require_services(PORTS["postgres"])
    assert _count(_test_database_url())[1] <= STEPS


def test_mariadb_node_checks_out_one_connection() -> None:
    require_services(3306)
    url = mariadb_url()
    assert _count(url)[1] <= STEPS


@pytest.mark.parametrize("per_node", [2])
def test_the_count_is_sensitive(tmp_path: Path, per_node: int) -> None:
    # Guards the counter itself: a run cannot take fewer than read + claim per node.
    assert _count_statements(f"sqlite:///{tmp_path}/count.sqlite3") > per_node * STEPS
