"""Issue 42 on each kind of store (SQLite, PostgreSQL, MariaDB): the hold and each move's
conditional write, on an in-process worker."""

from __future__ import annotations

import uuid

import pytest

from celery_saga import ExecutionState, InvalidStateError, Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app
from tests.test_hold_hand_on import _until

DOWN = {"now": True}


def _charge() -> str:
    if DOWN["now"]:
        raise ConnectionError("provider down")
    return "charged"


def test_hold_retry_skip_and_unwind_on_each_store(own_store: str) -> None:
    app = unconsumed_app("held-store")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=own_store)
    name = f"held{uuid.uuid4().hex[:6]}"
    engine.register(
        Saga(name)
        .step("reserve", lambda: None, compensate=lambda: None)
        .step("charge", _charge, compensate=lambda: None, on_failure="hold", hold_timeout=60)
        .step("ship", lambda: None)
    )
    engine.ensure_schema()
    DOWN["now"] = True
    with embedded_worker(app):
        runs = [engine.start(name, {}) for _ in range(3)]
        held = [_until(engine, run.id, ExecutionState.HELD) for run in runs]
        assert all(h.record.wake_at is not None for h in held), "the hold timeout is stored"
        DOWN["now"] = False
        engine.retry(runs[0].id)
        engine.skip(runs[1].id, result="by hand")
        engine.unwind(runs[2].id)
        for move in (engine.retry, engine.unwind):
            with pytest.raises(InvalidStateError, match="to be held"):
                move(runs[2].id)
        done = _until(engine, runs[0].id, ExecutionState.COMPLETED)
        skipped = _until(engine, runs[1].id, ExecutionState.COMPLETED)
        unwound = _until(engine, runs[2].id, ExecutionState.FAILED)
    assert done.step("charge").result == "charged"
    assert skipped.step("charge").result == "by hand"
    assert unwound.record.wake_at is None and unwound.rollback_status is not None
    engine.db.dispose()
