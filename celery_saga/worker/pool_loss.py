"""A pool process that dies (SIGKILL, the OOM killer, ``os._exit``) cannot give up its
claims (guarantee 30): its worker's main process does, as soon as Celery reports the loss
(``on_pool_loss``, through the request class ``celery_hooks`` gives each task) or, sooner,
as soon as ``PoolWatch`` sees the process gone; the run's message then runs again at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.holders import holder_name
from celery_saga.store.holders import release_claims_of
from celery_saga.store.transient import describe_store_error
from celery_saga.worker.holders import process_running, saga_header_of
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.saga_header import HEADER

logger = logging.getLogger("celery_saga")


class PoolWatch:
    """Notices, within a fraction of a second, a pool process that died running a saga
    message (Celery reports it seconds later), and gives its claims up (``on_pool_loss``).
    Runs in a worker's main process, under the prefork pool."""

    INTERVAL = 0.25

    def __init__(self, parts: WorkerParts) -> None:
        self.parts = parts
        self.reported: set[tuple[str, int]] = set()
        self._watching_in: int | None = None

    def start(self) -> None:
        """Watch from this process, once (a process may start several embedded workers)."""
        if self._watching_in != os.getpid():
            self._watching_in = os.getpid()
            threading.Thread(target=self._watch, name="saga-pool-watch", daemon=True).start()

    def _watch(self) -> None:
        from celery.worker import state as worker_state

        main = os.getpid()
        while True:
            time.sleep(self.INTERVAL)
            try:
                self._look(worker_state.active_requests, main)
            except Exception:  # the event loop changed the set meanwhile: look again soon
                logger.debug("pool watch: requests changed while looked at", exc_info=True)

    def _look(self, active: Any, main: int) -> None:
        requests = list(active)
        # only what Celery still holds: the set stays as small as the pool
        self.reported &= {(r.id, r.worker_pid) for r in requests}
        for request in requests:
            pid = request.worker_pid
            if not pid or pid == main or process_running(pid):
                continue
            if (request.id, pid) not in self.reported:
                self.reported.add((request.id, pid))
                on_pool_loss(self.parts, request, resend_always=True)


def on_pool_loss(parts: WorkerParts, request: Any, resend_always: bool = False) -> None:
    """Celery reports that the pool process running ``request`` died: give its claims up at
    once, on a thread (the main process's event loop must not wait on the store)."""
    header = saga_header_of(request)
    if header is None or not request.worker_pid:
        return
    holder = holder_name(str(request.hostname), int(request.worker_pid), request.id)
    execution_id = str(header["id"])

    def release() -> None:
        try:
            released = release_claims_of(
                parts.db, execution_id=execution_id, holder=holder, now=get_clock().now()
            )
        except Exception as error:
            logger.warning(
                "execution %s: the claims of pool process %s, which died, could not be given "
                "up (%s); they are taken over when their holder is asked or their lease ends",
                execution_id,
                request.worker_pid,
                describe_store_error(error),
            )
            return
        if not released:
            return
        redelivered = request.task.acks_late and request.task.reject_on_worker_lost
        redelivered = redelivered and not resend_always
        if not redelivered:  # the broker has forgotten it, or gives it back only later
            _send_again(parts, request, header)
        logger.warning(
            "execution %s: pool process %s died running %s; its claim was given up and its "
            "message %s, so it runs again at once",
            execution_id,
            request.worker_pid,
            request.name,
            "is redelivered" if redelivered else "sent again",
        )

    threading.Thread(target=release, name="saga-release-claims", daemon=True).start()


def _send_again(parts: WorkerParts, request: Any, header: dict[str, Any]) -> None:
    """The same message (task id, header, route, time limits), ``resent`` counting up so
    that the receiving worker treats it as a redelivery."""
    info = request.delivery_info or {}
    route = {k: info[k] for k in ("exchange", "routing_key") if info.get(k) is not None}
    hard, soft = getattr(request, "time_limits", None) or (None, None)
    limits = {"time_limit": hard, "soft_time_limit": soft} if hard or soft else {}
    parts.publisher.send(
        str(header["id"]),
        request.name,
        args=(),
        kwargs={},
        headers={HEADER: {**header, "resent": int(header.get("resent", 0)) + 1}},
        task_id=request.id,
        **route,
        **limits,
    )
