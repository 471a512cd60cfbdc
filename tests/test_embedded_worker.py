"""The embedded worker is quick with no tuning: on the in-process broker it polls every
10 ms unless the app chose an interval (kombu's 1 s made each idle hand-off wait up to a
second, so a five-step run took seconds and 500 in flight ran at 3 workflows/s)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from celery import Celery

from celery_saga import Saga, SagaEngine
from celery_saga.worker.embedded import MEMORY_POLLING_INTERVAL, embedded_worker

STEPS = 5


def _app(tmp_path: Path) -> tuple[Celery, SagaEngine, str]:
    app = Celery(f"embedded-{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
    app.conf.update(set_as_current=False, task_default_queue=app.main)
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")
    saga = Saga(f"five{uuid.uuid4().hex[:6]}")
    for index in range(STEPS):
        saga.step(f"s{index}", lambda: None)
    engine.register(saga)
    engine.ensure_schema()
    return app, engine, saga.name


def test_untuned_memory_broker_hands_steps_on_without_waiting_a_poll_second(
    tmp_path: Path,
) -> None:
    app, engine, saga = _app(tmp_path)
    with embedded_worker(app):
        assert app.conf.broker_transport_options["polling_interval"] == MEMORY_POLLING_INTERVAL
        engine.start(saga).wait(timeout=30)  # warm-up
        started = time.monotonic()
        run = engine.start(saga).wait(timeout=30, interval=0.01)
        took = time.monotonic() - started
    engine.db.dispose()
    assert run.state.value == "completed"
    # Five idle hand-offs took 2-5 s at kombu's 1 s; a bound generous for a shared machine.
    assert took < 1.5, f"a five-step run took {took:.2f} s"


def test_an_interval_the_app_chose_is_kept(tmp_path: Path) -> None:
    app, engine, saga = _app(tmp_path)
    app.conf.broker_transport_options = {"polling_interval": 0.05, "other": 1}
    with embedded_worker(app):
        assert engine.start(saga).wait(timeout=30).state.value == "completed"
    engine.db.dispose()
    assert app.conf.broker_transport_options == {"polling_interval": 0.05, "other": 1}
