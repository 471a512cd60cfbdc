"""A failed attempt leaves nothing behind once its task has ended: the exception its body
raised, that exception's traceback and the engine's frames between the task and the
user's code are freed by reference counting, not kept in a reference cycle until a full
garbage collection (which, in a pool process, came only every few thousand failed tasks:
the failure path's memory grew where the success path's stayed flat)."""

from __future__ import annotations

import gc
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery_saga import Saga, SagaEngine
from celery_saga.records import ExecutionState
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import (
    PORTS,
    _test_database_url,
    in_process_pg_engine,
    require_services,
    unconsumed_app,
)


class CardRefused(Exception):
    """A user's exception class (instances of user classes can be weakly referenced)."""


@contextmanager
def _without_cycle_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _freed(refs: list[weakref.ref[Any]], timeout: float = 5.0) -> bool:
    """Whether every exception of ``refs`` was freed; the task ends (``task_postrun``)
    right after the outcome it recorded, so this waits a little for it."""
    deadline = time.monotonic() + timeout
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(ref() is None for ref in refs)


def _refusing(raised: list[weakref.ref[CardRefused]], times: int) -> Callable[[], str]:
    """A body that raises ``CardRefused`` its first ``times`` calls, then succeeds."""

    def charge() -> str:
        if len(raised) < times:
            error = CardRefused("card refused")
            raised.append(weakref.ref(error))
            raise error
        return "charged"

    return charge


def test_a_failed_steps_exception_is_freed_without_a_garbage_collection() -> None:
    raised: list[weakref.ref[CardRefused]] = []
    saga = Saga(f"mem{uuid.uuid4().hex[:6]}")
    saga.step("reserve", lambda: None, compensate=lambda: None)
    saga.step("charge", _refusing(raised, times=1), retry=1)
    with in_process_pg_engine("mem", saga) as engine, _without_cycle_collection():
        run = engine.start(saga.name, {}).wait(timeout=30)
        assert run.state is ExecutionState.FAILED
        assert len(raised) == 1
        assert _freed(raised), "the failed step's exception is still referenced"


def test_a_retried_attempts_exception_is_freed_without_a_garbage_collection() -> None:
    raised: list[weakref.ref[CardRefused]] = []
    saga = Saga(f"mem{uuid.uuid4().hex[:6]}")
    saga.step("charge", _refusing(raised, times=2), retry=3, backoff=0.01)
    with in_process_pg_engine("mem", saga) as engine, _without_cycle_collection():
        run = engine.start(saga.name, {}).wait(timeout=30)
        assert run.state is ExecutionState.COMPLETED
        assert len(raised) == 2
        assert _freed(raised), "a retried attempt's exception is still referenced"


def test_a_failed_compensations_exception_is_freed_without_a_garbage_collection() -> None:
    raised: list[weakref.ref[CardRefused]] = []
    saga = Saga(f"mem{uuid.uuid4().hex[:6]}")
    saga.step("reserve", lambda: None, compensate=_refusing(raised, times=1), compensation_retry=2)
    saga.step("charge", _refusing([], times=1), retry=1)
    with in_process_pg_engine("mem", saga) as engine, _without_cycle_collection():
        run = engine.start(saga.name, {}).wait(timeout=30)
        assert run.state is ExecutionState.FAILED
        assert len(raised) == 1
        assert _freed(raised), "a failed compensation's exception is still referenced"


def test_the_exceptions_a_failure_was_raised_from_are_freed_too() -> None:
    raised: list[weakref.ref[CardRefused]] = []

    def charge() -> None:
        try:
            cause = CardRefused("the bank said no")
            raised.append(weakref.ref(cause))
            raise cause
        except CardRefused as bank:
            error = CardRefused("card refused")
            raised.append(weakref.ref(error))
            raise error from bank

    saga = Saga(f"mem{uuid.uuid4().hex[:6]}")
    saga.step("reserve", lambda: None, compensate=lambda: None)
    saga.step("charge", charge, retry=1)
    with in_process_pg_engine("mem", saga) as engine, _without_cycle_collection():
        run = engine.start(saga.name, {}).wait(timeout=30)
        assert run.state is ExecutionState.FAILED
        assert len(raised) == 2
        assert _freed(raised), "an exception of the failure's chain is still referenced"


class Basket:
    """A user's object that only the body's own frame holds."""


def test_a_step_that_retried_itself_leaves_its_frames_to_be_freed_at_once() -> None:
    """``self.retry()``: the task ends with Celery's ``Retry``, not with what the body
    raised, so the engine's frames between the task and the body, which hold it, are what
    must not keep the body's frame (and its locals) in a cycle."""
    require_services(PORTS["postgres"])
    held: list[weakref.ref[Basket]] = []
    app = unconsumed_app("mem")
    app.conf.broker_transport_options = {"polling_interval": 0.01}

    @app.task(name=f"mem.charge.{uuid.uuid4().hex[:6]}", bind=True, shared=False)
    def charge(self: Any) -> str:
        if not held:
            basket = Basket()
            held.append(weakref.ref(basket))
            raise self.retry(countdown=0.01, exc=ConnectionError("gateway busy"))
        return "charged"

    saga = Saga(f"mem{uuid.uuid4().hex[:6]}").step("charge", charge)
    engine = SagaEngine(app, store_url=_test_database_url())
    engine.register(saga)
    engine.ensure_schema()
    try:
        with embedded_worker(app, concurrency=1), _without_cycle_collection():
            run = engine.start(saga.name, {}).wait(timeout=30)
            assert run.state is ExecutionState.COMPLETED
            assert len(held) == 1
            assert _freed(held), "the frame of an attempt that retried itself is still referenced"
    finally:
        engine.db.dispose()
