"""Steps are Celery tasks: their queue, time limits and name; saga events reach monitors."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_saga import ExecutionState, Saga, SagaEngine
from celery_saga.decisions.admission import NodeMessage
from tests.conftest import Harness


def test_step_message_is_its_tasks_own_message_with_its_options(tmp_path: Path) -> None:
    app = Celery("routing", set_as_current=False, broker="memory://")
    app.conf.task_routes = {"shop.ship": {"queue": "shipping"}}
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")

    @app.task(name="shop.charge", time_limit=30, soft_time_limit=20, priority=7, shared=False)
    def charge() -> None: ...

    @app.task(name="shop.ship", shared=False)
    def ship() -> None: ...

    engine.register(
        Saga("order").step(charge).step(ship, timeout=5).step("note", lambda: None),
    )
    sent: list[dict[str, Any]] = []

    def capture(sender: Any = None, **fields: Any) -> None:
        sent.append({"task": sender, **fields})

    before_task_publish.connect(capture, weak=False)
    try:
        run = engine.start("order")
        definition = engine.definition("order")
        for node in (1, 2):  # no worker: publish the later steps as the engine would
            spec = definition.nodes[node].step
            engine.publisher.publish_node("order", spec, NodeMessage(run.id, node, 0, 0, 1))
    finally:
        before_task_publish.disconnect(capture)
    first, second, third = sent
    assert first["task"] == "shop.charge" and first["routing_key"] == "celery"
    assert list(first["headers"]["timelimit"]) == [30, 20]
    assert first["properties"]["priority"] == 7
    assert first["headers"]["celery_saga"]["id"] == run.id
    assert first["body"][:2] == ((), {})  # arguments are mapped after admission
    assert (second["task"], second["routing_key"]) == ("shop.ship", "shipping")
    assert second["headers"]["timelimit"][1] == 5  # the step's timeout is the soft limit
    assert (third["task"], third["routing_key"]) == ("order.note", "celery")


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
