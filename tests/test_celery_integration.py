"""Steps are Celery tasks: their queue, time limits and name; saga events reach monitors."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from celery import Celery

from celery_saga import ExecutionState
from celery_saga.worker.publisher import CeleryPublisher
from tests.conftest import Harness


def test_task_step_is_published_on_its_queue_with_its_limits_and_name() -> None:
    app = Celery("routing", set_as_current=False)
    app.conf.task_routes = {"shop.ship": {"queue": "shipping"}}

    @app.task(name="shop.charge", queue="payments", time_limit=30, soft_time_limit=20, shared=False)
    def charge() -> None: ...

    @app.task(name="shop.ship", shared=False)
    def ship() -> None: ...

    publisher = CeleryPublisher(app)
    options = publisher._options(charge, "order.charge")
    assert options["queue"].name == "payments"
    assert (options["shadow"], options["time_limit"], options["soft_time_limit"]) == (
        "shop.charge",
        30,
        20,
    )
    assert publisher._options(ship, "order.ship")["queue"].name == "shipping"
    plain = publisher._options(lambda: None, "order.note")
    assert plain == {"shadow": "order.note"}


def test_steps_show_under_their_task_names_and_saga_events_reach_monitors(
    harness: Harness,
) -> None:
    if harness.in_process:
        pytest.skip("the embedded worker sends no events over the memory transport")
    app = harness.test_app.app
    captured: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": captured.append})
        listener = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": None, "wakeup": False}
        )
        listener.daemon = True
        listener.start()
        time.sleep(1.0)
        run = harness.start("five", {"order": 30})
        assert run.wait(30).state is ExecutionState.COMPLETED
        deadline = time.monotonic() + 10
        wanted = {("saga-step-completed", "s5"), ("saga-completed", None)}
        while time.monotonic() < deadline:
            got = {(e["type"], e.get("step")) for e in captured if e.get("execution_id") == run.id}
            if wanted <= got:
                break
            time.sleep(0.1)
        receiver.should_stop = True
    received = {e.get("name") for e in captured if e["type"] == "task-received"}
    assert {"sagaapp.s1", "sagaapp.s2", "five.s3"} <= received
    got = {(e["type"], e.get("step")) for e in captured if e.get("execution_id") == run.id}
    assert wanted <= got
