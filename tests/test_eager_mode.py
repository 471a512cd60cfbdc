"""``task_always_eager=True`` (how many Django test suites run Celery): a saga runs in the
calling process, compensations and signals included, and ``start`` returns when nothing is
left to run."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_saga import ExecutionState, RollbackStatus, Saga, SagaEngine


@pytest.fixture
def eager(tmp_path: Path) -> tuple[Celery, SagaEngine, list[str]]:
    app = Celery("eager", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, broker_url="memory://")
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")
    calls: list[str] = []

    @app.task(name="shop.reserve", shared=False)
    def reserve(order: int) -> dict[str, int]:
        calls.append(f"reserve {order}")
        return {"reserved": order}

    @app.task(name="shop.release", shared=False)
    def release(result: Any) -> None:
        calls.append(f"release {result}")

    @app.task(name="shop.charge", bind=True, shared=False)
    def charge(self: Any, order: int, declined: bool = False) -> str:
        calls.append(f"charge {order} try {self.request.retries}")
        if self.request.retries < 1:
            raise self.retry(countdown=30, exc=ConnectionError("gateway busy"))
        if declined:
            raise ValueError("card declined")
        return "charged"

    def ship(order: int) -> str:
        calls.append(f"ship {order}")
        return "shipped"

    engine.register(
        Saga("order").step(reserve, compensate=release).step(charge).step("ship", ship),
        Saga("approval").step(reserve, compensate=release).wait_for("approved").step("ship", ship),
    )
    return app, engine, calls


def test_start_runs_the_whole_saga_in_the_calling_process(eager: Any) -> None:
    _, engine, calls = eager
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no AlwaysEagerIgnored: nothing goes to a broker
        run = engine.start("order", {"order": 1})
    execution = run.get()
    assert execution.state is ExecutionState.COMPLETED
    assert calls == ["reserve 1", "charge 1 try 0", "charge 1 try 1", "ship 1"]
    assert execution.step("charge").attempts == 2  # the retry ran at once, as eager retries do


def test_a_failing_step_is_compensated_before_start_returns(eager: Any) -> None:
    _, engine, calls = eager
    run = engine.start("order", {"order": 2, "declined": True})  # eager_propagates: no raise
    execution = run.get()
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert calls[-1] == "release {'reserved': 2}"
    assert "card declined" in (execution.failure_reason or "")


def test_a_wait_parks_and_the_signal_runs_the_rest(eager: Any) -> None:
    _, engine, calls = eager
    run = engine.start("approval", {"order": 3})
    assert run.get().state is ExecutionState.WAITING
    assert engine.signal(run.id, "approved")
    assert run.get().state is ExecutionState.COMPLETED
    assert calls == ["reserve 3", "ship 3"]
