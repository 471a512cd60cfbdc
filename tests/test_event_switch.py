"""Saga events follow the worker's event switch at run time: ``celery control
enable_events`` (what Flower does on start) turns them on in the pool's processes too."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState
from tests.conftest import (
    BROKERS,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    require_services,
    stop_workers,
)
from tests.sagaapp import TestApp


@pytest.fixture
def quiet_worker(tmp_path: Path) -> Iterator[TestApp]:
    """One prefork worker started without -E, on a queue of its own."""
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    broker, store = BROKERS["postgres-rabbitmq"], _test_database_url()
    queue = f"saga-events-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": broker,
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_QUEUE": queue,
        "SAGA_TEST_DUPLICATE": "0",
        "PYTHONPATH": str(Path.cwd()),
    }
    client = TestApp(broker, store, queue)
    workers, _ = _spawn_workers(env, queue, tmp_path, count=1, events=False)
    try:
        _wait_ready(client, 1, workers)
        yield client
    finally:
        stop_workers(workers)


@contextmanager
def _events_of(client: TestApp) -> Iterator[list[dict[str, Any]]]:
    """Every event on the broker's event stream while the block runs."""
    captured: list[dict[str, Any]] = []
    with client.app.connection_for_read() as connection:
        receiver = client.app.events.Receiver(connection, handlers={"*": captured.append})
        listener = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": None, "wakeup": False}
        )
        listener.daemon = True
        listener.start()
        time.sleep(1.0)
        yield captured
        time.sleep(1.0)  # the last events of the last run
        receiver.should_stop = True


def _run(client: TestApp) -> str:
    run = client.engine.start("five", {"order": 1})
    assert run.wait(30).state is ExecutionState.COMPLETED
    return str(run.id)


def test_saga_events_follow_enable_and_disable_events(quiet_worker: TestApp) -> None:
    client = quiet_worker
    with _events_of(client) as captured:
        before = _run(client)
        assert client.app.control.enable_events(reply=True, timeout=2)
        enabled = _run(client)
        assert client.app.control.disable_events(reply=True, timeout=2)
        disabled = _run(client)
    seen: dict[str, set[str]] = {before: set(), enabled: set(), disabled: set()}
    for event in captured:
        if event.get("execution_id") in seen:
            seen[event["execution_id"]].add(event["type"])
    assert seen[before] == set(), "a worker started without -E sends no saga events"
    assert {"saga-step-started", "saga-step-completed", "saga-completed"} <= seen[enabled]
    assert seen[disabled] == set()
