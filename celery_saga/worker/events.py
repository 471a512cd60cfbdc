"""Saga events: in-process listeners, and Celery custom events Flower can see."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from celery import Celery, current_task
from celery.signals import worker_init

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
        "saga-message-refused",
        "saga-waiting",
        "saga-signal-received",
        "saga-resumed",
        "saga-wait-expired",
        "saga-recovered",
    }
)


class EventHub:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self._listeners: dict[str, list[Listener]] = defaultdict(list)
        #: Like task events: on with ``worker_send_task_events`` or a worker started with -E.
        self.send_to_celery = bool(app.conf.worker_send_task_events)
        worker_init.connect(self._on_worker_init, weak=False)

    def _on_worker_init(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.send_to_celery = bool(getattr(sender, "task_events", self.send_to_celery))

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
