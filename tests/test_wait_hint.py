"""``SagaHandle.wait()`` on a run that does not move says which queue no worker consumes,
and says nothing when a worker has the queue and the run is merely slow or parked."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_saga import ExecutionState, RunNotSettledError, Saga, SagaEngine, SagaError
from celery_saga.worker import handle as handle_module
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[SagaEngine]:
    app = unconsumed_app("hint")
    app.conf.broker_transport_options = {"polling_interval": 0.01}

    app.conf.task_routes = {f"{app.main}.charge": {"queue": f"{app.main}-payments"}}

    @app.task(name=f"{app.main}.charge")
    def charge(order_id: str) -> str:
        return f"CH-{order_id}"

    @app.task(name=f"{app.main}.slow")
    def slow(order_id: str) -> str:
        time.sleep(3)
        return order_id

    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/hint.sqlite3")
    engine.register(
        Saga("pay").step(charge),
        Saga("slow").step(slow),
        Saga("gated").wait_for("approved", timeout=60).step("done", lambda: None),
    )
    yield engine
    engine.db.dispose()


def test_timeout_names_the_queue_nobody_consumes(shop: SagaEngine) -> None:
    run = shop.start("pay", {"order_id": "A1"})
    with pytest.raises(TimeoutError) as raised:
        run.wait(timeout=1)
    message = str(raised.value)
    assert "still running after 1s" in message
    assert f"no worker seems to consume queue '{shop.app.main}-payments'" in message


def test_a_quiet_run_is_reported_once_as_a_warning_before_the_timeout(
    shop: SagaEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(handle_module, "QUIET_SECONDS", 0.2)
    run = shop.start("pay", {"order_id": "A1"})
    with caplog.at_level(logging.WARNING, logger="celery_saga"), pytest.raises(TimeoutError):
        run.wait(timeout=2.5)
    warnings = [r.getMessage() for r in caplog.records if "no worker seems" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"queue '{shop.app.main}-payments'" in warnings[0]
    assert run.id in warnings[0]


def test_only_the_queue_without_a_consumer_is_named(shop: SagaEngine) -> None:
    default_queue = shop.app.conf.task_default_queue
    with embedded_worker(shop.app, queues=[default_queue]):
        run = shop.start("pay", {"order_id": "A1"})
        with pytest.raises(TimeoutError) as raised:
            run.wait(timeout=1.5)
    assert f"consume queue '{shop.app.main}-payments'" in str(raised.value)
    assert f"'{default_queue}'" not in str(raised.value)


def test_a_slow_step_on_a_consumed_queue_gets_no_hint(
    shop: SagaEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(handle_module, "QUIET_SECONDS", 0.3)
    with embedded_worker(shop.app, queues=[shop.app.conf.task_default_queue]):
        run = shop.start("slow", {"order_id": "S1"})
        with (
            caplog.at_level(logging.WARNING, logger="celery_saga"),
            pytest.raises(TimeoutError) as raised,
        ):
            run.wait(timeout=1.5)
        assert run.wait(timeout=10).state is ExecutionState.COMPLETED
    assert "no worker" not in str(raised.value)
    assert not [r for r in caplog.records if "no worker" in r.getMessage()]


def test_a_run_waiting_for_a_signal_is_quiet_on_purpose(
    shop: SagaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handle_module, "QUIET_SECONDS", 0.2)
    with embedded_worker(shop.app, queues=[shop.app.conf.task_default_queue]):
        run = shop.start("gated")
        assert run.wait(timeout=10).state is ExecutionState.WAITING
    calls: list[Any] = []
    monkeypatch.setattr(
        "celery_saga.worker.stall_hints.queue_consumers", lambda *a: calls.append(a) or {}
    )
    with pytest.raises(TimeoutError) as raised:
        run.wait(timeout=1, states=[ExecutionState.COMPLETED])
    assert "no worker" not in str(raised.value)
    assert calls == [], "a waiting run must not make wait() ask the workers"


def test_a_worker_that_never_imported_the_saga_makes_wait_name_the_step_nobody_took(
    shop: SagaEngine,
) -> None:
    """A worker of another app (one that never imported the saga's module) consumes the
    queue: Celery drops the plain-function step's message as an unregistered task."""
    queue = shop.app.conf.task_default_queue
    other = Celery(f"{shop.app.main}-other", broker="memory://localhost/", set_as_current=False)
    other.conf.update(task_default_queue=queue, broker_transport_options={"polling_interval": 0.01})
    shop.register(Saga("plain").step("only", lambda: None))
    with embedded_worker(other, queues=[queue], hostname=f"{queue}-other@localhost"):
        run = shop.start("plain")
        with pytest.raises(RunNotSettledError) as raised:
            run.wait(timeout=1.5)
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, SagaError)
    message = str(raised.value)
    assert f"execution '{run.id}' of saga 'plain' still running after 1.5s" in message
    assert "at step 'only', whose task 'plain.only' no worker has taken" in message, message
    assert "Received unregistered task" in message and "autodiscover_sagas()" in message
