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

from celery_saga import Saga
from celery_saga.records import ExecutionState
from tests.conftest import in_process_pg_engine


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


def _freed(refs: list[weakref.ref[CardRefused]], timeout: float = 5.0) -> bool:
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
