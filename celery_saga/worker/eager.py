"""``task_always_eager``: the engine's messages run in the calling process.

Celery's eager mode runs ``apply_async`` inline but ignores ``send_task``. With it set, the
engine applies each message it would publish in place, one after another: the first
publish (``engine.start``, ``signal``, ``resume_compensation``) runs the saga until nothing
is left to run (a wait for a signal, or the end), so a test that starts a saga sees it
finished when ``start`` returns. Messages published while one runs are queued, not nested,
so a long saga does not deepen the stack. A countdown (a retry's backoff) is not waited for,
as in Celery's own eager mode; a ``wait_for`` deadline needs the timer sweep and a clock
(see ``celery_saga.testing``).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from celery import Celery


class EagerRunner:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self._local = threading.local()

    def send(self, name: str, options: dict[str, Any]) -> None:
        queue: deque[tuple[str, dict[str, Any]]] | None = getattr(self._local, "queue", None)
        if queue is not None:
            queue.append((name, options))
            return
        queue = self._local.queue = deque([(name, options)])
        try:
            while queue:
                self._apply(*queue.popleft())
        finally:
            self._local.queue = None

    def _apply(self, name: str, options: dict[str, Any]) -> None:
        self.app.tasks[name].apply(
            args=options.get("args") or (),
            kwargs=options.get("kwargs") or {},
            headers=options.get("headers"),
            retries=options.get("retries") or 0,
            task_id=options.get("task_id"),
            throw=False,  # a failed step is the saga's to record, not the caller's to catch
        )
