"""Telling a caller of ``SagaHandle.wait()`` why a run does not move.

The usual reason a freshly started run sits still is that no worker consumes the queue its
next message went to (no worker started, or one started without ``-Q`` for that queue).
``ProgressWatch`` notices that a run has not changed for a while; ``missing_consumers``
then asks the workers which queues they consume and names the queues nobody does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import node_steps
from celery_saga.records import Execution, ExecutionState
from celery_saga.worker.publisher import CeleryPublisher

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

logger = logging.getLogger("celery_saga")

#: Seconds without any change to a run before ``wait()`` looks for a consumer.
QUIET_SECONDS = 5.0
#: How long the workers get to answer the ``active_queues`` broadcast.
INSPECT_TIMEOUT = 1.0
#: States in which a run moves only when a worker takes its next message; a run waiting
#: for a signal or parked for an operator is quiet on purpose.
_MOVED_BY_WORKERS = (ExecutionState.RUNNING, ExecutionState.COMPENSATING)


def _fingerprint(execution: Execution) -> tuple[Any, ...]:
    record = execution.record
    steps = tuple(
        (s.name, s.status, s.attempts, s.compensation_status, s.compensation_attempts)
        for s in execution.steps
    )
    return (record.state, record.version, record.cursor, record.cursor_sub, steps)


@dataclass
class ProgressWatch:
    """Remembers when a polled run last changed (``observe`` on each poll)."""

    changed_at: float
    _last: tuple[Any, ...] | None = None

    def observe(self, execution: Execution, now: float) -> float:
        """Record this poll; returns how long the run has not changed."""
        fingerprint = _fingerprint(execution)
        if fingerprint != self._last:
            self._last, self.changed_at = fingerprint, now
        return now - self.changed_at


def moved_by_workers(execution: Execution) -> bool:
    return execution.state in _MOVED_BY_WORKERS


def saga_queues(app: Celery, definition: SagaDefinition, execution: Execution) -> list[str]:
    """The queues the run's next messages go to: the current node's steps while running
    forward, every step's (and the engine's own) queue while unwinding."""
    publisher = CeleryPublisher(app)
    engine_queue = publisher.queue_for(None)
    nodes = list(definition.nodes)
    cursor = execution.record.cursor
    if execution.state is ExecutionState.RUNNING and 0 <= cursor < len(nodes):
        nodes = [nodes[cursor]]
    queues: list[str] = []
    for node in nodes:
        specs = list(node_steps(node))
        targets = [spec.action for spec in specs]
        if execution.state is ExecutionState.COMPENSATING:
            targets += [spec.compensation for spec in specs if spec.compensation is not None]
        for target in targets or [None]:
            queue = publisher.queue_for(target)
            if queue not in queues:
                queues.append(queue)
    if engine_queue not in queues and execution.state is ExecutionState.COMPENSATING:
        queues.append(engine_queue)
    return queues


def missing_consumers(app: Celery, queues: list[str]) -> list[str] | None:
    """The queues in ``queues`` that no worker answering a broadcast consumes; None when
    the broker cannot broadcast, so nothing can be said."""
    try:
        replies = app.control.inspect(timeout=INSPECT_TIMEOUT).active_queues() or {}
    except Exception:  # a transport without broadcast support: no hint rather than a crash
        logger.debug("could not ask the workers for their queues", exc_info=True)
        return None
    consumed = {q.get("name") for answer in replies.values() for q in answer or []}
    return [queue for queue in queues if queue not in consumed]


def no_consumer_hint(
    app: Celery, definition: SagaDefinition, execution: Execution, quiet_for: float
) -> str | None:
    """A sentence naming the queues of the run's next messages that no worker consumes, or
    None when every such queue has a consumer (the run is slow, not stranded)."""
    missing = missing_consumers(app, saga_queues(app, definition, execution))
    if not missing:
        return None
    names = ", ".join(repr(q) for q in missing)
    noun = "queue" if len(missing) == 1 else "queues"
    return (
        f"execution {execution.id!r} of saga {execution.record.saga_name!r} made no progress "
        f"for {quiet_for:.0f} s: no worker seems to consume {noun} {names} "
        f"(start one with: celery -A <your app> worker -Q {','.join(missing)})"
    )


def stall_hint(engine: SagaEngine, execution: Execution, quiet_for: float) -> str:
    """For ``SagaHandle.wait``: the no-consumer sentence, logged once as a warning, or ""
    when the run is not one a worker should be moving or every queue has a consumer (then
    the same question is not asked again during this wait)."""
    if not moved_by_workers(execution):
        return ""
    definition = engine.catalog(execution.record.saga_name)
    if definition is None:
        return ""
    hint = no_consumer_hint(engine.app, definition, execution, quiet_for)
    if hint:
        logger.warning("%s", hint)
    return hint or ""
