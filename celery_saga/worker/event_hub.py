"""Saga events: in-process listeners, and Celery custom events Flower can see.

A plain event hub: it changes nothing in Celery. The worker's ``-E`` and the
``enable_events`` / ``disable_events`` control commands reach its switch through
``celery_hooks``."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from multiprocessing.sharedctypes import RawValue
from typing import Any

from celery import Celery, current_task

logger = logging.getLogger("celery_saga")
Listener = Callable[[str, dict[str, Any]], None]

#: Every event type the engine emits; ``"*"`` subscribes to all of them.
EVENT_TYPES = frozenset(
    {
        "saga-started",
        "saga-completed",
        "saga-failed",
        "saga-forward-failed",
        "saga-step-started",
        "saga-step-completed",
        "saga-step-retry",
        "saga-step-failed",
        "saga-compensation-started",
        "saga-step-compensated",
        "saga-compensation-retry",
        "saga-compensation-failed",
        "saga-compensation-stuck",
        "saga-compensation-resumed",
        "saga-compensation-resolved",
        "saga-message-refused",
        "saga-node-passed",
        "saga-waiting",
        "saga-signal-received",
        "saga-resumed",
        "saga-wait-expired",
        "saga-recovered",
        "saga-cancelled",
    }
)


class EventHub:
    """Calls in-process listeners and sends each event to Celery's event stream when the
    worker sends task events: ``worker_send_task_events``, ``-E``, or switched at run time
    by ``celery control enable_events`` / ``disable_events`` (what Flower does). The switch
    is a byte of memory shared with the pool's processes, which send the events, while the
    control command reaches only the worker's main process."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._listeners: dict[str, list[Listener]] = defaultdict(list)
        self._switch = RawValue("b", bool(app.conf.worker_send_task_events))

    @property
    def send_to_celery(self) -> bool:
        return bool(self._switch.value)

    def switch(self, on: bool) -> None:
        self._switch.value = on

    def subscribe(self, event: str, listener: Listener) -> None:
        if event != "*" and event not in EVENT_TYPES:
            raise ValueError(f"unknown saga event {event!r}; known: {sorted(EVENT_TYPES)}")
        self._listeners[event].append(listener)

    def unsubscribe(self, event: str, listener: Listener) -> None:
        self._listeners[event].remove(listener)

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        for listener in (*self._listeners.get(event, ()), *self._listeners.get("*", ())):
            try:
                listener(event, fields)
            except Exception:
                logger.exception("saga event listener %r failed on %s", listener, event)
        self._send_celery_event(event, fields)

    def _send_celery_event(self, event: str, fields: dict[str, Any]) -> None:
        if not self.send_to_celery or not current_task:
            return
        task = current_task._get_current_object()
        if not task.request.id:
            return
        try:
            task.send_event(event, **fields)
        except Exception:
            logger.warning("could not send Celery event %s", event, exc_info=True)
