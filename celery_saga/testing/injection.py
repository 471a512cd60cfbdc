"""Carrying out a point's faults around the user's own step and compensation bodies.

The explorer registers a copy of the saga whose steps call the user's functions through
``Injector.forward`` and ``Injector.reversal``: each call asks ``points.injection`` what to
do for its run (raise, deliver a copy of its own message first, or be interrupted once the
body ran) and counts the bodies that ran to their end. Nothing in the engine is changed for
it: a step's own message is copied as the broker would deliver it twice, and an interruption
goes through the one seam the engine has for a worker's shutdown
(``runtime/stopping.set_probe``), so the engine gives the claim up and sends the message
again exactly as when a worker stops under a body.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery

from celery_saga.definition.hashing import callable_identity
from celery_saga.definition.nodes import split_iteration
from celery_saga.runtime.invoke import call_arguments
from celery_saga.runtime.saga_context import SagaContext
from celery_saga.store import history
from celery_saga.store.database import Database
from celery_saga.store.history import Kind
from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.points import Injection, Point, injection
from celery_saga.worker.celery_hooks import CeleryHooks
from celery_saga.worker.saga_header import HEADER, read_header

#: A message as sent again: its task's name, its task id and its saga header.
Message = tuple[str, str, dict[str, Any]]

#: Seconds a body waits for the copy of its message to be handled before it runs.
COPY_WAIT = 5.0
#: Seconds between two looks for the claim an interrupted attempt gives up.
RELEASE_POLL = 0.01
#: The kinds of the history row written when an interrupted attempt gives its claim up.
RELEASED = frozenset({Kind.STEP_RELEASED.value, Kind.REVERSAL_RELEASED.value})


class InjectedFailure(Exception):
    """The failure an exploration injected into a step or a compensation."""


class InjectedInterruption(Exception):
    """A body cut short after it ran, as when its worker dies before recording it."""


def interrupted_by_explorer(error: BaseException) -> bool:
    return isinstance(error, InjectedInterruption)


class Injector:
    """The points of the runs being explored, and what their bodies did.

    ``assign(run, point)`` gives a run its point before it starts; ``disarm(run)`` lets a
    parked run's failing reversal succeed on resume. ``completed(run)`` counts the bodies
    that ran to their end per (record, is reversal); ``copies(run)`` lists the messages of
    that run that were delivered twice, for a copy after the run settled too.
    """

    def __init__(
        self, app: Celery, hooks: CeleryHooks, db: Database, clock: ControlledClock
    ) -> None:
        self.app, self.db, self.clock = app, db, clock
        self._lock = threading.Condition()
        self._points: dict[str, Point] = {}
        self._disarmed: set[str] = set()
        self._paths: dict[str, Mapping[str, str]] = {}
        self._calls: Counter[tuple[str, str, bool]] = Counter()
        self._completed: Counter[tuple[str, str, bool]] = Counter()
        self._copies: dict[str, list[Message]] = {}
        self._handled: Counter[str] = Counter()
        self._stop_counting = hooks.when_task_ends(self._on_postrun)

    def close(self) -> None:
        self._stop_counting()

    # -- the runs' points -------------------------------------------------------------------
    def assign(self, execution_id: str, point: Point) -> None:
        with self._lock:
            self._points[execution_id] = point
            self._paths[execution_id] = dict(point.paths)

    def disarm(self, execution_id: str) -> None:
        with self._lock:
            self._disarmed.add(execution_id)

    def path(self, execution_id: str, branch: str) -> str | None:
        """The path a run is sent down at ``branch`` (None: its selector chooses)."""
        with self._lock:
            return self._paths.get(execution_id, {}).get(branch)

    def completed(self, execution_id: str) -> dict[tuple[str, bool], int]:
        with self._lock:
            return {(r, rev): n for (e, r, rev), n in self._completed.items() if e == execution_id}

    def copies(self, execution_id: str) -> list[Message]:
        with self._lock:
            return list(self._copies.get(execution_id, ()))

    # -- the bodies -----------------------------------------------------------------------
    def forward(self, original: Any, mapper: Any) -> Callable[[SagaContext], Any]:
        def explored(ctx: SagaContext) -> Any:
            kwargs = call_arguments(original, ctx, mapper)
            return self._run(ctx, False, lambda: original(**kwargs))

        return _named(explored, original)

    def reversal(self, original: Any, mapper: Any) -> Callable[[SagaContext], Any]:
        def explored(ctx: SagaContext) -> Any:
            kwargs = call_arguments(original, ctx, mapper, extra={"result": ctx.forward_result})
            return self._run(ctx, True, lambda: original(**kwargs))

        return _named(explored, original)

    def _run(self, ctx: SagaContext, reversal: bool, call: Callable[[], Any]) -> Any:
        run, record = ctx.execution_id, ctx.step_name
        with self._lock:
            self._calls[(run, record, reversal)] += 1
            point = None if run in self._disarmed and reversal else self._points.get(run)
            what = injection(point, record, reversal, self._calls[(run, record, reversal)])
        if what is Injection.RAISE:
            assert point is not None
            raise InjectedFailure(f"failure injected at point {point.id!r}")
        if what is Injection.COPY:
            self.deliver_copy(run, *self._own_message(ctx, reversal))
        value = call()
        message = self._own_message(ctx, reversal) if what is Injection.INTERRUPT else None
        if inspect.iscoroutine(value):
            return self._awaited(value, run, record, reversal, message)
        return self._ran(value, run, record, reversal, message)

    async def _awaited(
        self, coroutine: Any, run: str, record: str, reversal: bool, message: Message | None
    ) -> Any:
        return self._ran(await coroutine, run, record, reversal, message)

    def _ran(
        self, value: Any, run: str, record: str, reversal: bool, message: Message | None
    ) -> Any:
        """Count a body that ran to its end; with ``message``, cut its attempt short."""
        with self._lock:
            self._completed[(run, record, reversal)] += 1
        if message is not None:
            threading.Thread(target=self._redeliver, args=(run, record, message)).start()
            raise InjectedInterruption(f"{record!r} of run {run} cut short after its body ran")
        return value

    # -- copies of a message ----------------------------------------------------------------
    def _own_message(self, ctx: SagaContext, reversal: bool) -> Message:
        """The message running this body: its step's task and that task's request (pushed
        on the thread the body runs on, a reversal's timeout thread included)."""
        suffix = ".compensate" if reversal else ""
        task_name = f"{ctx.saga_name}.{split_iteration(ctx.step_name)[0]}{suffix}"
        request = self.app.tasks[task_name].request
        header = read_header(request)
        if header is None or request.id is None:
            raise RuntimeError(f"{task_name}: no saga message runs this body")
        return task_name, str(request.id), dict(header)

    def deliver_copy(self, run: str, task_name: str, task_id: str, header: dict[str, Any]) -> None:
        """Send the message ``task_id`` once more, as a broker delivering it twice would,
        and wait until a worker has handled it."""
        with self._lock:
            self._copies.setdefault(run, []).append((task_name, task_id, header))
            seen = self._handled[task_id]
        self._send(task_name, task_id, header)
        with self._lock:
            self._lock.wait_for(lambda: self._handled[task_id] > seen, timeout=COPY_WAIT)

    def _redeliver(self, run: str, record: str, message: Message) -> None:
        """As a broker redelivers the message of a worker that died: once the engine has
        given the claim up (its own resend comes a second later). The clock moves a
        millisecond first: a lease given up ends "now", and is free only once now is past
        it."""
        deadline = time.monotonic() + COPY_WAIT
        while time.monotonic() < deadline:
            rows = history.load(self.db, run)
            if any(row.kind in RELEASED and row.step == record for row in rows):
                break
            time.sleep(RELEASE_POLL)
        self.clock.advance(0.001)
        self._send(*message)

    def _send(self, task_name: str, task_id: str, header: dict[str, Any]) -> None:
        queue = str(self.app.conf.task_default_queue)
        self.app.send_task(task_name, headers={HEADER: header}, task_id=task_id, queue=queue)

    def _on_postrun(self, task_id: str | None) -> None:
        if task_id is None:
            return
        with self._lock:
            self._handled[task_id] += 1
            self._lock.notify_all()


def _named(explored: Callable[[SagaContext], Any], original: Any) -> Callable[[SagaContext], Any]:
    """A distinct name per wrapped callable, so the copy's versions differ as the user's do."""
    explored.__qualname__ = f"explored.{callable_identity(original)}"
    explored.__name__ = explored.__qualname__
    return explored
