"""Telling a caller of ``SagaHandle.wait()`` why a run does not move.

The usual reason a freshly started run sits still is that no worker consumes the queue its
next message went to (no worker started, or one started without ``-Q`` for that queue).
``ProgressWatch`` notices that a run has not changed for a while; ``queue_consumers``
then asks the workers which queues they consume and names the queues nobody does. When
every queue has a consumer, the consumers are asked whether they hand the run's message
back, and why (``hand_back_notes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery import Celery

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import node_steps
from celery_saga.records import Execution, ExecutionState
from celery_saga.runtime.catalog import Catalog
from celery_saga.worker.hand_back_notes import hand_back_hint
from celery_saga.worker.publisher import CeleryPublisher

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


def queue_consumers(app: Celery, queues: list[str]) -> dict[str, list[str]] | None:
    """The workers answering a broadcast that consume each of ``queues``; None when the
    broker cannot broadcast, so nothing can be said."""
    try:
        replies = app.control.inspect(timeout=INSPECT_TIMEOUT).active_queues() or {}
    except Exception:  # a transport without broadcast support: no hint rather than a crash
        logger.debug("could not ask the workers for their queues", exc_info=True)
        return None
    found: dict[str, list[str]] = {queue: [] for queue in queues}
    for node, answer in replies.items():
        for consumed in answer or []:
            if consumed.get("name") in found:
                found[consumed["name"]].append(str(node))
    return found


def no_consumer_hint(execution: Execution, missing: list[str], quiet_for: float) -> str:
    """A sentence naming the queues of the run's next messages that no worker consumes."""
    names = ", ".join(repr(q) for q in missing)
    noun = "queue" if len(missing) == 1 else "queues"
    return (
        f"{_no_progress(execution, quiet_for)}: no worker seems to consume {noun} {names} "
        f"(start one with: celery -A <your app> worker -Q {','.join(missing)})"
    )


def stall_hint(app: Celery, catalog: Catalog, execution: Execution, quiet_for: float) -> str:
    """For ``SagaHandle.wait``: the no-consumer sentence, else what the consumers of the
    run's queues say about handing its message back (``hand_back_notes``), logged once as a
    warning; "" when the run is not one a worker should be moving or nothing is wrong that
    the workers know of (then the same question is not asked again during this wait)."""
    if not moved_by_workers(execution):
        return ""
    definition = catalog(execution.record.saga_name)
    if definition is None:
        return ""
    consumers = queue_consumers(app, saga_queues(app, definition, execution))
    if consumers is None:
        return ""
    missing = [queue for queue, nodes in consumers.items() if not nodes]
    if missing:
        hint = no_consumer_hint(execution, missing, quiet_for)
    else:
        workers = sorted({node for nodes in consumers.values() for node in nodes})
        handed = hand_back_hint(app, execution.id, workers)
        if handed is None:
            return ""
        hint = f"{_no_progress(execution, quiet_for)}: {handed}"
    logger.warning("%s", hint)
    return hint


def _no_progress(execution: Execution, quiet_for: float) -> str:
    saga = execution.record.saga_name
    return f"execution {execution.id!r} of saga {saga!r} made no progress for {quiet_for:.0f} s"
