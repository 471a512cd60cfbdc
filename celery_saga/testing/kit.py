"""``SagaKit``: run a user's sagas to their end inside a test, on an in-process worker, with
time under the test's control.

The kit drives a real engine: a Celery app on the in-memory broker, a SQLite store and an
embedded worker thread, so steps run as they would in production (admission, retries,
reversals), only all in this process. Wait deadlines move with the ``ControlledClock``: a
test crosses a week-long ``wait_for`` timeout in milliseconds with ``kit.advance(...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_saga.definition.builder import Saga
from celery_saga.definition.nodes import WaitNode
from celery_saga.records import Execution, ExecutionState, RollbackStatus, StepRecord
from celery_saga.store.waits import load_signals
from celery_saga.testing.clock import ControlledClock
from celery_saga.worker.engine import SagaEngine

if TYPE_CHECKING:
    from celery_saga.testing.report import ExplorationReport


@dataclass(frozen=True)
class Timeline:
    """A finished (or parked) run, in a form tests assert on.

    ``events`` lists what happened to each step in order: forward outcomes in start order
    (``"completed reserve"``, ``"failed charge"``), then reversals in the order they ran
    (``"compensated reserve"``); ``signals`` the events the run received.
    """

    execution: Execution
    events: tuple[str, ...]
    signals: tuple[str, ...]

    @property
    def state(self) -> ExecutionState:
        return self.execution.state

    @property
    def rollback_status(self) -> RollbackStatus | None:
        return self.execution.rollback_status

    @property
    def failure_reason(self) -> str | None:
        return self.execution.failure_reason

    @property
    def results(self) -> dict[str, Any]:
        return self.execution.results

    def step(self, name: str) -> StepRecord:
        return self.execution.step(name)


def _reversal_order(record: StepRecord) -> tuple[Any, int]:
    # Under a frozen clock many reversals share a timestamp: then the unwind's own order
    # (reverse start order) decides.
    return (record.compensated_at, -record.id)


def timeline_of(engine: SagaEngine, execution_id: str) -> Timeline:
    execution = engine.get(execution_id)
    events = [f"{record.status.value} {record.name}" for record in execution.steps]
    reversed_steps = [r for r in execution.steps if r.compensation_status is not None]
    for record in sorted(reversed_steps, key=_reversal_order):
        assert record.compensation_status is not None
        events.append(f"{record.compensation_status.value} {record.name}")
    received = tuple(sorted(load_signals(engine.db, execution_id)))
    return Timeline(execution, tuple(events), received)


class SagaKit:
    """Start runs, answer their gates, move time, and read their timelines."""

    def __init__(self, engine: SagaEngine, clock: ControlledClock, timeout: float = 10.0) -> None:
        self.engine, self.clock, self.timeout = engine, clock, timeout

    def run(
        self,
        saga: str,
        input: Mapping[str, Any] | None = None,
        *,
        signals: Mapping[str, Any] | None = None,
        execution_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Timeline:
        """Start ``saga`` (with ``labels``, as ``engine.start``) and drive it until it
        settles. A run that parks at a gate whose event is in ``signals`` gets that signal
        (with its payload) and goes on; one that waits for anything else is returned
        waiting (``kit.advance`` times it out)."""
        handle = self.engine.start(
            saga, dict(input or {}), execution_id=execution_id, labels=labels
        )
        return self.finish(handle.id, signals)

    def finish(self, execution_id: str, signals: Mapping[str, Any] | None = None) -> Timeline:
        """Wait until the run settles (answering gates from ``signals``); its timeline."""
        pending = dict(signals or {})
        handle = self.engine.handle(execution_id)
        while True:
            execution = handle.wait(self.timeout)
            if execution.state is not ExecutionState.WAITING:
                return timeline_of(self.engine, execution_id)
            event = self._gate_event(execution)
            if event is None or event not in pending:
                return timeline_of(self.engine, execution_id)
            # A signal to a parked run moves it to running in the same transaction.
            self.engine.signal(execution_id, event, pending.pop(event))

    def _gate_event(self, execution: Execution) -> str | None:
        nodes = self.engine.definition(execution.record.saga_name).nodes
        node = nodes[execution.record.cursor] if execution.record.cursor < len(nodes) else None
        return node.event if isinstance(node, WaitNode) else None

    def explore(self, saga: Saga, input: Any = None, **options: Any) -> ExplorationReport:
        """``celery_saga.testing.explore`` on this kit's engine and worker: fail ``saga`` at
        every point. Its copy of the saga stays registered on the engine (new runs of that
        saga start on it), so explore in a test of its own."""
        from celery_saga.testing.explorer import explore_on

        return explore_on(self.engine, self.clock, saga, input, **options)

    def advance(self, seconds: float) -> int:
        """Move the clock ``seconds`` forward and run the deadline sweep beat would run;
        returns how many waiting runs it timed out."""
        self.clock.advance(seconds)
        return self.engine.fire_timers()
