"""``async def`` steps and compensations: run to completion on an event loop the worker owns.

One loop per thread of each process (a prefork child; each thread of a threads pool, the
embedded worker's included), made on first use and reused by every later async body there,
so a client made once (an ``httpx.AsyncClient``) keeps its connections across steps; never
``asyncio.run`` per call. A forked child never runs its parent's loop: it makes its own.

A body's ``timeout`` is kept inside the loop: at the deadline the coroutine is cancelled
(``asyncio.CancelledError`` where it awaits), and once it has finished unwinding the
attempt fails with ``StepTimeoutError``, so no retry or reversal starts beside it. Under the
prefork pool the message's soft time limit is ignored meanwhile (its signal, raised inside
the loop's own code, would leave the loop unusable); the hard limit still ends a body that
blocks the loop and never reaches an ``await``.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from celery_saga.definition.validation import is_async_callable
from celery_saga.errors import SagaError, StepTimeoutError
from celery_saga.runtime.task_body import timed_out
from celery_saga.runtime.timeouts import run_with_timeout, shield_from_soft_limit


class _ThreadLoop(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    pid: int = 0


_current = _ThreadLoop()
#: Every loop made here, with its thread and process: a loop is closed once its thread has
#: ended (a stopped pool's threads), not left to the garbage collector's warning.
_made: list[tuple[int, threading.Thread, asyncio.AbstractEventLoop]] = []
_made_lock = threading.Lock()


def worker_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop in this process, made on first use."""
    loop, pid = _current.loop, os.getpid()
    if loop is None or _current.pid != pid or loop.is_closed():
        loop = asyncio.new_event_loop()
        _current.loop, _current.pid = loop, pid
        with _made_lock:
            _close_finished(pid)
            _made.append((pid, threading.current_thread(), loop))
    return loop


def _close_finished(pid: int) -> None:
    for entry in list(_made):
        owner_pid, thread, loop = entry
        if owner_pid == pid and not thread.is_alive() and not loop.is_running():
            loop.close()
            _made.remove(entry)


def _reset_after_fork() -> None:
    # A lock another thread held at the fork stays held in the child: take a new one.
    global _made_lock
    _made_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@atexit.register
def _close_all() -> None:
    with _made_lock:
        for owner_pid, _, loop in _made:
            if owner_pid == os.getpid() and not loop.is_running() and not loop.is_closed():
                loop.close()


def run_body(target: Any, call: Callable[[], Any], timeout: float | None, what: str) -> Any:
    """``call()`` a step's or reversal's body ``target`` within ``timeout`` seconds: an async
    one on this thread's loop, any other as ``run_with_timeout`` does. A plain callable that
    hands back a coroutine (a lambda around an async function) has it awaited too. Past its
    timeout, the running task's body ends with the ``StepTimeoutError`` (``timed_out``)."""
    try:
        if is_async_callable(target):
            shield_from_soft_limit()  # until the message ends: the deadline is kept in the loop
            return run_coroutine(call, timeout, what)
        value = run_with_timeout(call, timeout, what)
        if inspect.iscoroutine(value):
            return run_coroutine(lambda: value, timeout, what)
        return value
    except StepTimeoutError as error:
        timed_out(target, error)
        raise


def run_coroutine(start: Callable[[], Awaitable[Any]], timeout: float | None, what: str) -> Any:
    """Await what ``start()`` returns on this thread's loop, cancelled past ``timeout``."""
    if _running_loop() is not None:
        raise SagaError(
            f"{what} is async and this thread already runs an event loop (task_always_eager "
            "called from async code?): run the saga on a worker"
        )
    loop = worker_loop()
    future = asyncio.ensure_future(_within(start, timeout, what), loop=loop)
    try:
        return loop.run_until_complete(future)
    except BaseException as error:
        # The body's own exception, unchanged but for its traceback (no ``from``: a cause
        # the body gave it stays).
        raise error.with_traceback(_from_body(error.__traceback__))  # noqa: B904
    finally:
        if not future.done():  # stopped from outside the loop: never resumed by a later body
            future.cancel()
            _current.loop = None


async def _within(start: Callable[[], Awaitable[Any]], timeout: float | None, what: str) -> Any:
    body = asyncio.ensure_future(start())
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        body.cancel()

    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.call_later(timeout, expire)
    try:
        return await body
    except asyncio.CancelledError as cancelled:
        if expired:  # the body has stopped: its traceback shows where it awaited
            raise StepTimeoutError(f"{what} timed out after {timeout:g}s") from cancelled
        # Not its deadline: something in the body cancelled it. A failed attempt like any
        # other (a bare CancelledError is no Exception and would escape the outcome record).
        raise SagaError(f"{what} was cancelled by its own code") from cancelled
    finally:
        if deadline is not None:
            deadline.cancel()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _from_body(tb: TracebackType | None) -> TracebackType | None:
    """The body's own frames: the loop's and the engine's above them left out, so the
    traceback reads as a plain call's (an error of the engine's own keeps every frame)."""
    first = tb
    while first is not None and str(first.tb_frame.f_globals.get("__name__", "")).startswith(
        ("asyncio.", "celery_saga.")
    ):
        first = first.tb_next
    return tb if first is None else first
