"""The pytest plugin: fixtures for testing your own sagas.

Opt-in, as Celery's ``celery.contrib.pytest`` is: ``pytest_plugins =
["celery_saga.testing.plugin"]`` in your root ``conftest.py``, or ``pytest -p
celery_saga.testing.plugin``.

``saga_clock``       a ``ControlledClock`` installed for the test (restored after).
``saga_celery_app``  a Celery app on the in-memory broker with a SQLite store in the test's
                     temporary directory; override it to bring your own app's settings.
``saga_engine``      the ``SagaEngine`` of that app, schema migrated; register your sagas.
``saga_kit``         a ``SagaKit`` with an embedded worker running: ``saga_kit.run(...)``
                     drives a run to its end and returns its ``Timeline``;
                     ``saga_kit.explore(saga, input)`` fails a saga at every point
                     (``celery_saga.testing.explore``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_saga.runtime.clock import set_clock
from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.kit import SagaKit
from celery_saga.worker.embedded import embedded_worker
from celery_saga.worker.engine import SagaEngine


@pytest.fixture
def saga_clock() -> Iterator[ControlledClock]:
    clock = ControlledClock()
    previous = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(previous)


@pytest.fixture
def saga_celery_app(tmp_path: Path) -> Celery:
    # Its own queue name: every app in the process shares the in-memory transport.
    name = f"saga-test-{uuid.uuid4().hex[:10]}"
    app = Celery(name, broker="memory://localhost/", set_as_current=False)
    app.conf.update(
        task_default_queue=name,
        saga_store_url=f"sqlite:///{tmp_path}/saga-store.sqlite3",
        broker_transport_options={"polling_interval": 0.01},
        worker_hijack_root_logger=False,
    )
    return app


@pytest.fixture
def saga_engine(saga_celery_app: Celery) -> Iterator[SagaEngine]:
    engine = getattr(saga_celery_app, "saga_engine", None)
    engine = engine if isinstance(engine, SagaEngine) else SagaEngine(saga_celery_app)
    engine.ensure_schema()
    yield engine
    engine.db.dispose()


@pytest.fixture
def saga_kit(saga_engine: SagaEngine, saga_clock: ControlledClock) -> Iterator[SagaKit]:
    options: dict[str, Any] = {"hostname": f"saga-kit-{uuid.uuid4().hex[:8]}@localhost"}
    with embedded_worker(saga_engine.app, concurrency=2, **options):
        yield SagaKit(saga_engine, saga_clock)
