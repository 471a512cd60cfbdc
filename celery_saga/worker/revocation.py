"""Whether a worker announced REVOKED the task whose body a run's cancel stopped: the probe
the runtime asks (``runtime/revocation.py``), from the pool process that ran the body.

Celery's revoke with ``terminate`` signals the pool process and, in the same step of the
worker's main process, marks the task ready and announces it (``task-revoked``), so the
worker no longer lists it as active. Nothing of that reaches the pool process, which only
sees the signal. So the pool process asks its worker (Celery's ``query_task``): a task it
still runs that its worker no longer lists was revoked. A body run by the worker's own
process (threads, solo, an in-process worker) is never revoked: Celery cannot terminate it,
and its revoke fails without announcing anything. A worker that does not answer: not
revoked either, and the task then ends as its attempt did.
"""

from __future__ import annotations

import logging
import os

from celery import current_task

from celery_saga.runtime.holders import parse_holder

logger = logging.getLogger("celery_saga")

#: Seconds the pool process waits for its worker's answer (a few ms on a live broker).
ASK_TIMEOUT = 1.0

#: The worker's main process, as it starts (before its pool forks); None: no worker here.
_worker_pid: int | None = None


def remember_worker_process() -> None:
    global _worker_pid
    _worker_pid = os.getpid()


def revoke_announced(holder: str | None) -> bool:
    """Whether the worker named by ``holder`` (this pool process's own claim) announced the
    task it names revoked; asked while that task still runs here."""
    parsed = parse_holder(holder or "")
    app = getattr(current_task, "app", None)
    if parsed is None or parsed[2] == "-" or app is None or _worker_pid in (None, os.getpid()):
        return False
    node, _, task_id = parsed
    try:
        inspect = app.control.inspect(destination=[node], timeout=ASK_TIMEOUT, limit=1)
        replies = inspect.query_task(task_id)
    except Exception as error:
        logger.warning("could not ask %s whether it revoked task %s: %r", node, task_id, error)
        return False
    listed = (replies or {}).get(node)
    return isinstance(listed, dict) and task_id not in listed
