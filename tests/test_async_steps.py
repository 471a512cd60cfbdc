"""``async def`` steps and compensations run to completion on the worker's own event loop
(one per thread of each process, reused), within their timeout, with their context; what
cannot be awaited is refused at ``register()``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_saga import (
    DefinitionError,
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaContext,
    SagaEngine,
    SagaError,
    StepTimeoutError,
    UnknownSagaError,
    path,
    step,
)
from celery_saga.runtime.async_bodies import run_body, run_coroutine, worker_loop
from tests.conftest import Harness


def _loops_by_thread(rows: list[Any]) -> dict[tuple[str, str], set[str]]:
    """``{(pid, thread): {loop ids}}`` from the details ``tests.async_steps.where`` wrote."""
    seen: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if not row.direction.endswith("_async"):
            continue
        fields = dict(part.split("=", 1) for part in row.detail.split()[:3])
        seen.setdefault((fields["pid"], fields["thread"]), set()).add(fields["loop"])
    return seen


def test_a_saga_mixing_sync_and_async_steps_completes(harness: Harness) -> None:
    runs = [harness.start("async_mixed", {"order": n}) for n in (3, 4)]
    for run, order in zip(runs, (3, 4), strict=True):
        done = run.wait(30)
        assert done.state is ExecutionState.COMPLETED, done.failure_reason
        # An async step's value is what the coroutine returned, not the coroutine; its
        # context (idempotency key) is the one a sync step gets.
        assert done.results["fetch"] == {
            "quote": order * 10,
            "key": done.step("fetch").idempotency_key,
        }
        assert done.results["book"] == f"BOOKED-{order}"
    rows = [r for run in runs for r in harness.test_app.entries(run.id)]
    assert len([r for r in rows if r.direction == "forward_async"]) == 4
    # One loop per thread of a process, reused by every async body there.
    assert all(len(loops) == 1 for loops in _loops_by_thread(rows).values())


def test_a_saga_mixing_sync_and_async_compensations_unwinds(harness: Harness) -> None:
    run = harness.start("async_mixed", {"order": 5, "plan": {"last": {"fail": True}}})
    done = run.wait(30)
    assert done.state is ExecutionState.FAILED
    assert done.rollback_status is RollbackStatus.COMPLETED
    assert done.failure_reason == "ValueError: no quote for order 5"
    undone = [r for r in harness.test_app.entries(run.id) if r.direction.startswith("compensate")]
    # Reverse start order, async and sync alike, each once, with its context and result.
    assert [(r.step, r.direction) for r in undone] == [
        ("plain", "compensate_async"),
        ("book", "compensate_async"),
        ("fetch", "compensate_async"),
        ("prep", "compensate"),
    ]
    assert undone[1].detail.endswith("result='BOOKED-5'")
    assert all(r.key.endswith(":compensate") for r in undone)
    assert "'quote': 50" in undone[2].detail


def test_a_timed_out_async_step_is_cancelled_before_its_reversal_runs(
    harness: Harness,
) -> None:
    started = time.monotonic()
    run = harness.start("async_timed", {"order": 6})
    done = run.wait(40)
    assert done.state is ExecutionState.FAILED
    assert done.failure_reason == (
        "StepTimeoutError: step 'stall' of saga 'async_timed' timed out after 1s"
    )
    assert time.monotonic() - started < 30  # not the body's 60 s sleep
    rows = harness.test_app.entries(run.id)
    order = [(r.step, r.direction) for r in rows if r.direction != "forward"]
    assert order == [
        ("stall", "forward_begin"),
        ("stall", "cancelled"),  # the coroutine saw the cancel and stopped...
        ("stall", "compensate_async"),  # ...before any reversal started
        ("prep", "compensate"),
    ]


def test_a_timed_out_async_compensation_is_cancelled_before_the_unwind_parks(
    harness: Harness,
) -> None:
    run = harness.start("async_undo_timed", {"order": 7, "plan": {"refuse": {"fail": True}}})
    done = run.wait(40, states=[ExecutionState.COMPENSATION_STUCK])
    assert done.record.rollback_reason is not None
    assert "StepTimeoutError" in done.record.rollback_reason
    assert "timed out after 1s" in done.record.rollback_reason
    rows = harness.test_app.entries(run.id)
    assert [r.direction for r in rows if r.step == "hold"] == [
        "compensate_begin",
        "compensate_cancelled",  # stopped where it awaited, before the unwind parked
    ]


# -- the loop ------------------------------------------------------------------------------


async def _running_loop() -> asyncio.AbstractEventLoop:
    await asyncio.sleep(0)
    return asyncio.get_running_loop()


def test_one_loop_per_thread_is_made_once_and_reused() -> None:
    first = run_coroutine(_running_loop, None, "first")
    second = run_coroutine(_running_loop, 5, "second")
    assert first is second is worker_loop()
    assert not first.is_closed() and not first.is_running()
    other: list[asyncio.AbstractEventLoop] = []
    thread = threading.Thread(target=lambda: other.append(run_coroutine(_running_loop, 5, "x")))
    thread.start()
    thread.join()
    assert other[0] is not first


def test_a_forked_child_makes_its_own_loop() -> None:
    parent = worker_loop()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's teardown
        try:
            child = run_coroutine(_running_loop, 5, "in the child")
            again = run_coroutine(_running_loop, 5, "again")
            os.write(write, b"own" if child is not parent and again is child else b"parent's")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"own"
    assert run_coroutine(_running_loop, 5, "parent") is parent


def test_an_async_body_past_its_timeout_is_cancelled_before_the_error_is_raised() -> None:
    seen: list[str] = []

    async def stall() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # it may clean up, and it does so before the error
            seen.append("cancelled")
            raise

    started = time.monotonic()
    with pytest.raises(StepTimeoutError, match=r"step 'x' timed out after 0\.2s"):
        run_body(stall, stall, 0.2, "step 'x'")
    assert seen == ["cancelled"]
    assert time.monotonic() - started < 5
    assert run_coroutine(_running_loop, None, "after") is worker_loop()  # still usable


def test_an_async_bodys_own_timeout_error_is_not_taken_for_the_steps() -> None:
    async def own_deadline() -> None:
        await asyncio.wait_for(asyncio.sleep(5), 0.01)

    with pytest.raises(asyncio.TimeoutError) as raised:  # a builtin TimeoutError from 3.11
        run_body(own_deadline, own_deadline, 10, "step 'x'")
    assert not isinstance(raised.value, StepTimeoutError)


def test_a_body_that_cancels_itself_fails_its_attempt_and_is_no_timeout() -> None:
    async def gives_up() -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError()

    with pytest.raises(SagaError, match="step 'x' was cancelled by its own code") as raised:
        run_body(gives_up, gives_up, 10, "step 'x'")
    assert not isinstance(raised.value, StepTimeoutError)
    assert isinstance(raised.value, Exception)  # recorded as the attempt's failure


def test_a_plain_callable_that_returns_a_coroutine_has_it_awaited() -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    wrapped = lambda: double(21)  # noqa: E731 - what a user passes around an async client
    assert run_body(wrapped, wrapped, 5, "step 'x'") == 42


def test_an_async_bodys_traceback_starts_at_the_body() -> None:
    async def refuse() -> None:
        await asyncio.sleep(0)
        raise ValueError("refused")

    with pytest.raises(ValueError) as raised:
        run_body(refuse, refuse, None, "step 'x'")
    modules = [frame.f_globals["__name__"] for frame, _ in traceback.walk_tb(raised.tb)]
    # This test's frame, the one engine frame it called, then the body: no loop internals.
    assert not [m for m in modules if m.startswith("asyncio")], modules
    assert modules[-1] == __name__


# -- what register() refuses, and a plain call of a generated task -------------------------


@pytest.fixture
def local_engine(tmp_path: Path) -> SagaEngine:
    app = Celery(f"async-{tmp_path.name}", broker="memory://localhost/", set_as_current=False)
    return SagaEngine(app, store_url=f"sqlite:///{tmp_path}/store.sqlite3")


async def _fetch(ctx: SagaContext) -> str:
    return "fetched"


def _plain(ctx: SagaContext) -> str:
    return "plain"


async def _async_mapper(ctx: SagaContext) -> dict[str, Any]:
    return {}


async def _async_selector(ctx: SagaContext) -> str:
    return "a"


@pytest.mark.parametrize(
    ("saga", "named"),
    [
        (Saga("r1").step(_plain, args=_async_mapper), "the args= of step '_plain'"),
        (
            Saga("r2").step(_fetch, compensate=_plain, compensation_args=_async_mapper),
            "the compensation_args= of step '_fetch'",
        ),
        (Saga("r3").map("total", _async_selector), "the transform of map 'total'"),
        (Saga("r7").step(_plain, output_schema=_async_mapper), "the output_schema of step"),
        (
            Saga("r4").branch("route", _async_selector, path("a", step(_fetch))),
            "the selector of branch 'route'",
        ),
        (Saga("r5").do_until(_async_selector, step(_fetch)), "the condition of do_until '_fetch'"),
        (Saga("r6").for_each(_async_selector, step(_fetch)), "the items of for_each '_fetch'"),
    ],
)
def test_an_async_helper_is_refused_at_register_and_nothing_is_registered(
    local_engine: SagaEngine, saga: Saga, named: str
) -> None:
    with pytest.raises(DefinitionError, match="is an async function") as refused:
        local_engine.register(saga)
    assert named in str(refused.value) and repr(saga.name) in str(refused.value)
    with pytest.raises(UnknownSagaError):
        local_engine.definition(saga.name)


def test_an_async_celery_task_is_refused_at_register_with_the_reason(
    local_engine: SagaEngine,
) -> None:
    @local_engine.app.task(name="shop.fetch_async", shared=False)
    async def fetch_async() -> str:
        return "never awaited by Celery"

    with pytest.raises(DefinitionError) as refused:
        local_engine.register(Saga("shop").step(fetch_async))
    message = str(refused.value)
    assert "step 'fetch_async' of saga 'shop'" in message
    assert "Celery cannot run a coroutine as a task's body" in message
    assert "give the step the async function itself" in message
    with pytest.raises(UnknownSagaError):
        local_engine.definition("shop")


def test_a_plain_call_of_an_async_steps_task_returns_the_awaited_value(
    local_engine: SagaEngine,
) -> None:
    async def quote(order: int) -> int:
        await asyncio.sleep(0)
        return order * 10

    local_engine.register(Saga("quoting").step(quote))
    task = local_engine.app.tasks["quoting.quote"]
    assert task.apply(kwargs={"order": 4}).get() == 40
    assert task(order=5) == 50
