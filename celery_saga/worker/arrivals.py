"""A worker that starts tells the workers consuming its queues what it can run, so that the
messages they hold back for a worker like it go back at once (``HandBacks.arrived``), not at
the end of their backoff step: a rolling deploy's first new worker takes the waiting runs
within seconds, even while old workers still consume the queue.

Only the workers consuming one of its queues are told (Celery's ``active_queues`` says
which): a worker of an app without the engine would log an unknown command.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery

from celery_saga.decisions.hand_back import Arrival
from celery_saga.worker.hand_back import HandBacks
from celery_saga.worker.parts import WorkerParts

logger = logging.getLogger("celery_saga")

#: The remote-control command a started worker sends the others.
COMMAND = "saga_worker_arrived"
#: Seconds after its consumer starts before a worker announces itself: it consumes by then.
ANNOUNCE_AFTER = 1.0
#: How long the workers get to say which queues they consume.
ASK_TIMEOUT = 1.0


def announce(parts: WorkerParts, consumer: Any) -> None:
    """Tell the workers consuming ``consumer``'s queues that it started, from a thread of
    its own (the broadcast waits for answers). In-process ``memory://`` has no others."""
    transport = getattr(getattr(consumer, "connection", None), "transport", None)
    if getattr(transport, "driver_type", None) == "memory":
        return
    thread = threading.Thread(
        target=_announce, args=(parts, consumer), name="saga-arrival", daemon=True
    )
    thread.start()


def _announce(parts: WorkerParts, consumer: Any) -> None:
    time.sleep(ANNOUNCE_AFTER)
    try:
        node = str(consumer.hostname)
        task_consumer = consumer.task_consumer
        queues = {q.name for q in task_consumer.queues} if task_consumer is not None else set()
        others = consumers_of(parts.app, queues) - {node}
        if others:
            parts.app.control.broadcast(
                COMMAND,
                arguments=_arguments(parts, consumer, node),
                destination=sorted(others),
                reply=False,
            )
    except Exception:  # the others then hand back at their own pace: nothing is lost
        logger.warning("could not tell the other workers that this one started", exc_info=True)


def consumers_of(app: Celery, queues: set[str]) -> set[str]:
    """The workers answering a broadcast that consume one of ``queues``."""
    replies = app.control.inspect(timeout=ASK_TIMEOUT).active_queues() or {}
    return {
        str(node)
        for node, answer in replies.items()
        if any(q.get("name") in queues for q in answer or [])
    }


def _arguments(parts: WorkerParts, consumer: Any, node: str) -> dict[str, Any]:
    catalog = parts.catalog
    registered = [[d.name, d.hash] for name in catalog.names() for d in catalog.versions(name)]
    return {
        "node": node,
        "store": parts.store_id,
        "versions": registered,
        "tasks": sorted(str(name) for name in consumer.strategies),
    }


def answer(hand_backs: HandBacks, state: Any, **arguments: Any) -> dict[str, int]:
    """The ``saga_worker_arrived`` command, in a worker's main process."""
    node = str(arguments["node"])
    arrival = Arrival(
        str(arguments["store"]),
        frozenset((str(saga), str(version)) for saga, version in arguments["versions"]),
        frozenset(str(task) for task in arguments["tasks"]),
    )
    released = hand_backs.arrived(node, arrival)
    if released:
        logger.info("%s started and can run %d message(s) held here: sent back now", node, released)
    return {"released": released}
