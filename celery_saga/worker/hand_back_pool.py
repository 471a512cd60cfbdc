"""Hand-backs that only the store can decide, made by the task in a pool process, and the
marking of a run as waiting for its version (guarantee 22).

A message that names no version (sent by an older release) reaches the pool, where the run
read from the store says its version is not registered here (``VersionNotDeployedError``);
a message naming another store finds its run missing from this one (``delivery``). The task
sends the message again with this hand-back's step of the backoff as a real countdown, which
Celery honours, and with the header saying why (the run's version, or this store among those
that lack the run), so the next consumer that cannot run it holds it without reading the
store (``hand_back``).

A run is marked as waiting for its version once per message, at its first hand-back (the
header's ``marked`` says it is done): the mark is what ``get``, ``saga show`` and ``saga
list`` show, and writing it again per hand-back would only cost the store a transaction.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.hand_back import HandBackReason, hold_seconds
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.outcomes import NoBody
from celery_saga.runtime.process_name import process_name
from celery_saga.store import versions
from celery_saga.store.database import Database
from celery_saga.worker.hand_back_notes import Handed, log_hand_back
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.saga_header import ABSENT, HANDED, HEADER, MARKED, VERSION, read_header

logger = logging.getLogger("celery_saga")


def hand_back_running(
    parts: WorkerParts, task: Any, reason: HandBackReason, saga: str, version: str | None
) -> NoBody:
    """The message now running in ``task`` cannot run here: send it again with a real
    countdown (see the module's docstring)."""
    request = task.request
    header = dict(read_header(request) or {})
    args = list(request.args or ())
    execution_id = str(header.get("id") or (args[0] if args else ""))
    header.update(id=execution_id, saga=header.get("saga") or saga)
    if version is not None:
        header[VERSION] = version  # the run's own: a consumer without it holds the message
    times = int(header.get(HANDED) or 0)
    if reason is HandBackReason.RUN_NOT_IN_STORE:
        header[ABSENT] = [*(header.get(ABSENT) or ()), parts.store_id]
    elif not header.get(MARKED) and mark_waiting(parts.db, execution_id, version or "unknown"):
        header[MARKED] = True
    countdown = hold_seconds(times, taker_arrived=False, draw=get_clock().random())
    hard, soft = request.timelimit or (None, None)
    options: dict[str, Any] = {"time_limit": hard, "soft_time_limit": soft} if hard or soft else {}
    delivery_info = request.delivery_info or {}
    for key in ("exchange", "routing_key"):
        if delivery_info.get(key) is not None:
            options[key] = delivery_info[key]
    parts.publisher.send(
        execution_id,
        task.name,
        args=args,
        kwargs={},  # a saga message's arguments are all in ``args`` and the header
        headers={HEADER: {**header, HANDED: times + 1}},
        task_id=request.id,
        retries=request.retries or 0,
        countdown=countdown,
        expires=None,
        **options,
    )
    handed = Handed.of(header, task.name, reason, times + 1, countdown, delivery_info)
    log_hand_back(handed, parts.shown_store)
    parts.notes.add(handed)  # seen by the worker's own answer in a thread pool
    return NoBody(f"handed back: {reason.value}")


def drop_absent_run(parts: WorkerParts, task: Any, header: dict[str, Any]) -> NoBody:
    """The message's run is still absent from this worker's store after its bound of
    hand-backs (``gives_up_on_absent_run``): it is dropped as stale, with one INFO line."""
    logger.info(
        "execution %s of saga %r is not in this worker's saga store (%s) and its message %s "
        "was handed back %d times: dropped as stale (a run that another store holds is sent "
        "again by that store's recovery sweep)",
        header.get("id"),
        header.get("saga"),
        parts.shown_store,
        task.name,
        int(header.get(HANDED) or 0),
    )
    return NoBody("dropped: run absent from this store")


def mark_waiting(db: Database, execution_id: str, version: str) -> bool:
    """Mark the run as waiting for its version; best effort: a hand-back never waits for a
    store that is down. False: not marked (not in this store, or the store failed)."""
    try:
        return versions.mark_waiting(
            db,
            execution_id=execution_id,
            definition_hash=version,
            handed_back_by=process_name(),
            now=get_clock().now(),
        )
    except SQLAlchemyError as error:
        logger.info("execution %s: not marked as waiting for its version (%s)", execution_id, error)
        return False


@dataclass(eq=False)
class Mark:
    """One marking asked for; ``wrote`` once the store has it."""

    execution_id: str
    version: str
    wrote: bool = False


class Marks:
    """Marks runs as waiting for their version from one thread of its own (the consumer's
    never waits for the store), started on first use: in a worker's main process, after its
    pool has forked. A run already waiting for its mark is not queued again: through a store
    outage every hand-back step of an unmarked run asks anew, and the store then gets one
    write per run when it is back, not a burst of one per step."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: SimpleQueue[Mark] = SimpleQueue()
        self._pending: dict[str, Mark] = {}  # execution id -> its mark not yet tried
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, handed: Handed) -> Mark:
        with self._lock:
            pending = self._pending.get(handed.execution_id)
            if pending is not None:
                return pending
            mark = self._pending[handed.execution_id] = Mark(
                handed.execution_id, handed.version or "unknown"
            )
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="saga-hand-back-marks", daemon=True
                )
                self._thread.start()
        self._queue.put(mark)
        return mark

    def _run(self) -> None:
        while True:
            mark = self._queue.get()
            try:
                mark.wrote = mark_waiting(self.db, mark.execution_id, mark.version)
            except Exception:  # best effort, as a store error is: the thread goes on
                logger.exception("execution %s: not marked as waiting", mark.execution_id)
            with self._lock:
                self._pending.pop(mark.execution_id, None)
