"""``SagaHandle``: a started run, to read it or block until it settles."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from celery import Celery

from celery_saga.errors import RunNotSettledError
from celery_saga.records import Execution, ExecutionState
from celery_saga.runtime.catalog import Catalog
from celery_saga.worker.awaiting import waiting_for
from celery_saga.worker.stall_hints import QUIET_SECONDS, ProgressWatch, stall_hint
from celery_saga.worker.step_tasks import StepTasks

#: States in which a run does nothing more until someone acts: done, or waiting for a
#: signal or an operator.
SETTLED_STATES = (
    ExecutionState.COMPLETED,
    ExecutionState.FAILED,
    ExecutionState.CANCELLED,
    ExecutionState.COMPENSATION_STUCK,
    ExecutionState.WAITING,
    ExecutionState.HELD,
)


class Engine(Protocol):
    """What a handle uses of its ``SagaEngine``: ``get``, and what names a stalled run's
    queues and tasks."""

    app: Celery
    catalog: Catalog
    step_tasks: StepTasks

    def get(self, execution_id: str) -> Execution: ...


class SagaHandle:
    """A started execution: its id, and helpers to read it or block until it settles."""

    def __init__(self, engine: Engine, execution_id: str) -> None:
        self.engine, self.id = engine, execution_id

    def get(self) -> Execution:
        return self.engine.get(self.id)

    def wait(
        self,
        timeout: float = 30.0,
        interval: float = 0.05,
        states: Iterable[ExecutionState] = SETTLED_STATES,
    ) -> Execution:
        """Poll until the run is in one of ``states`` (default: completed, failed, parked
        as compensation_stuck, or waiting for a signal); for scripts and tests.

        A run that does not change for ``QUIET_SECONDS`` (5 s) while only a worker can move
        it makes ``wait`` ask the workers which queues they consume: if none consumes the
        queue of the run's next message, a warning names it, and so does the error; if its
        consumers hand the message back (a task or a version they lack, a store without
        the run), the warning and the error say which worker and why. Past ``timeout``:
        ``RunNotSettledError`` (a ``TimeoutError`` too), saying where the run stands and
        what would move it."""
        wanted = tuple(states)
        started = time.monotonic()
        deadline = started + timeout
        watch, hint = ProgressWatch(changed_at=started), None
        while True:
            execution = self.get()
            if execution.state in wanted:
                return execution
            now = time.monotonic()
            quiet_for = watch.observe(execution, now)
            timed_out = now >= deadline
            if hint is None and (quiet_for >= QUIET_SECONDS or (timed_out and quiet_for > 0)):
                engine = self.engine
                hint = stall_hint(engine.app, engine.catalog, execution, quiet_for)
            if timed_out:
                raise RunNotSettledError(self._not_settled(execution, timeout, hint))
            time.sleep(interval)

    def _not_settled(self, execution: Execution, timeout: float, hint: str | None) -> str:
        saga = execution.record.saga_name
        message = (
            f"execution {self.id!r} of saga {saga!r} still {execution.state.value} "
            f"after {timeout:g}s"
        )
        engine = self.engine
        where = waiting_for(engine.catalog, engine.step_tasks, execution, explained=bool(hint))
        return "; ".join(part for part in (message, where, hint) if part)

    def __repr__(self) -> str:
        return f"SagaHandle({self.id!r})"
