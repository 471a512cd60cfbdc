"""Sagas of two versions and the parked runs of the older one, for the tests of upgrades
and of ``saga versions check`` from a process without the older version's code."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery_saga import ExecutionState, Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import (
    PORTS,
    fresh_mariadb_database,
    fresh_pg_database,
    require_services,
    unconsumed_app,
)


def hold() -> str:
    return "held"


def hold_v2() -> str:
    return "held twice"


def release() -> None: ...


def done() -> None: ...


def notify() -> None: ...


def take() -> str:
    return "taken"


def give_back() -> None:
    raise RuntimeError("the refund service is down")


def give_back_v2() -> None: ...


def boom() -> None:
    raise ValueError("declined")


def approve(version: str, hold_body: Any = hold) -> Saga:
    """Parks on a wait after a step with a compensation."""
    saga = Saga("approve", version=version).step("hold", hold_body, compensate=release)
    return saga.wait_for("ok").step("done", done)


def refund(version: str, undo: Any = give_back) -> Saga:
    """Parks ``compensation_stuck``: its second step fails, the first one's reversal too."""
    saga = Saga("refund", version=version)
    saga = saga.step("take", take, compensate=undo, compensation_retry=1)
    return saga.step("boom", boom, retry=1)


V1 = (approve("1"), refund("1"))


def make_own_store(kind: str, tmp_path: Path) -> str:
    """An empty store of the test's own: the check reads every run in it."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/versions.sqlite3"
    if kind == "postgres":
        require_services(PORTS["postgres"])
        return fresh_pg_database("versions")
    return fresh_mariadb_database("versions")


def engine_with(store: str, *sagas: Saga) -> SagaEngine:
    app = unconsumed_app("versions")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=store)
    engine.register(*sagas)
    engine.ensure_schema()
    return engine


def settle(engine: SagaEngine, execution_id: str, *states: ExecutionState) -> None:
    deadline = time.monotonic() + 30
    while engine.get(execution_id).state not in states:
        assert time.monotonic() < deadline, engine.get(execution_id)
        time.sleep(0.05)


def park_v1_runs(store: str, sagas: tuple[Saga, ...] = V1) -> dict[str, str]:
    """Runs of version 1, left by a process that has it: ``waiting`` on its wait,
    ``stuck`` parked in its unwind, ``completed`` over. The process is gone after."""
    old = engine_with(store, *sagas)
    with embedded_worker(old.app, concurrency=1):
        runs = {
            "waiting": old.start("approve", {}).id,
            "stuck": old.start("refund", {}).id,
            "completed": old.start("approve", {}).id,
        }
        settle(old, runs["waiting"], ExecutionState.WAITING)
        settle(old, runs["completed"], ExecutionState.WAITING)
        old.signal(runs["completed"], "ok")
        settle(old, runs["completed"], ExecutionState.COMPLETED)
        settle(old, runs["stuck"], ExecutionState.COMPENSATION_STUCK)
    old.db.dispose()
    return runs
