"""What a hand-back says: its one log line, and what the workers tell ``SagaHandle.wait()``
about a run that does not move.

A worker that hands a run's message back cannot always write it where the caller reads:
a worker of another deployment has another store. So each worker keeps its recent
hand-backs in memory (``HandBackNotes``) and answers the ``saga_hand_backs`` remote-control
command; ``hand_back_hint`` asks the workers consuming the run's queues about it and names
the real cause: a task or a version the worker lacks, or a store that does not hold the run.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery

from celery_saga.decisions.hand_back import HandBackReason
from celery_saga.worker.saga_header import version_of

logger = logging.getLogger("celery_saga")

#: The remote-control command a worker answers with its hand-backs of some runs.
COMMAND = "saga_hand_backs"
#: How many runs' latest hand-backs a worker remembers.
REMEMBERED = 1000
#: How long the workers get to answer.
ASK_TIMEOUT = 1.0


@dataclass(frozen=True)
class Handed:
    """One hand-back: ``times`` counts it (1 for the first), ``countdown`` is how long the
    message stays away, ``queue`` the routing key it came with."""

    execution_id: str
    saga: str
    task: str
    version: str | None
    reason: HandBackReason
    times: int
    countdown: float
    queue: str | None = None

    @classmethod
    def of(
        cls,
        header: dict[str, Any],
        task: str,
        reason: HandBackReason,
        times: int,
        countdown: float,
        delivery_info: Any,
    ) -> Handed:
        queue = (delivery_info or {}).get("routing_key")
        return cls(
            str(header["id"]),
            str(header.get("saga") or "?"),
            task,
            version_of(header),
            reason,
            times,
            countdown,
            str(queue) if queue else None,
        )


def log_hand_back(handed: Handed, store: str) -> None:
    """The one line a hand-back leaves (``message <task> handed back (<n>)`` in each)."""
    if handed.reason is HandBackReason.RUN_NOT_IN_STORE:
        why = f" of saga {handed.saga!r} is not in this worker's saga store ({store})"
        whom = "a worker of its own store"
    else:
        why = f": version {handed.version} of saga {handed.saga!r}"
        if handed.reason is HandBackReason.UNKNOWN_TASK:
            why += f" (task {handed.task})"
        why += " is not registered on this worker"
        whom = "a worker that has it"
    logger.warning(
        "execution %s%s; message %s handed back (%d) for %s, offered again in %.2f s",
        handed.execution_id,
        why,
        handed.task,
        handed.times,
        whom,
        handed.countdown,
    )


class HandBackNotes:
    """The latest hand-back of each of the last ``REMEMBERED`` runs this process handed
    back (from the consumer's thread and its timer's)."""

    def __init__(self) -> None:
        self._notes: OrderedDict[str, Handed] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, handed: Handed) -> None:
        with self._lock:
            self._notes.pop(handed.execution_id, None)
            self._notes[handed.execution_id] = handed
            while len(self._notes) > REMEMBERED:
                self._notes.popitem(last=False)

    def about(self, execution_ids: list[str]) -> dict[str, dict[str, Any]]:
        with self._lock:
            found = [self._notes[i] for i in execution_ids if i in self._notes]
        return {h.execution_id: {**asdict(h), "reason": h.reason.value} for h in found}


def answer(notes: HandBackNotes, shown_store: str, state: Any, **arguments: Any) -> dict[str, Any]:
    """The ``saga_hand_backs`` command, in a worker's main process: ``notes`` are its
    hand-backs, ``shown_store`` its store as a reader sees it."""
    ids = [str(i) for i in arguments.get("execution_ids") or ()]
    return {"store": shown_store, "runs": notes.about(ids)}


def ask(app: Celery, execution_id: str, workers: list[str]) -> list[tuple[str, str, Handed]]:
    """(worker, its store, its hand-back) for each of ``workers`` that handed the run back
    (only they are asked: a worker of an app without the engine would log an unknown
    command)."""
    try:
        replies = app.control.broadcast(
            COMMAND,
            arguments={"execution_ids": [execution_id]},
            destination=workers,
            reply=True,
            timeout=ASK_TIMEOUT,
        )
    except Exception:  # a transport without broadcast support: nothing can be said
        logger.debug("could not ask the workers for their hand-backs", exc_info=True)
        return []
    found = []
    for reply in replies or ():
        for node, answered in (reply or {}).items():
            note = ((answered or {}).get("runs") or {}).get(execution_id)
            if isinstance(note, dict):
                handed = Handed(**{**note, "reason": HandBackReason(note["reason"])})
                found.append((str(node), str(answered.get("store")), handed))
    return found


def hand_back_hint(app: Celery, execution_id: str, workers: list[str]) -> str | None:
    """A sentence naming which of ``workers`` hand the run's message back and why, or None."""
    found = ask(app, execution_id, workers) if workers else []
    if not found:
        return None
    _, store, handed = max(found, key=lambda item: item[2].times)
    nodes = ", ".join(sorted({n for n, _, h in found if h.reason is handed.reason}))
    so_far = f"hands its message {handed.task} back ({handed.times} times so far)"
    if handed.reason is HandBackReason.RUN_NOT_IN_STORE:
        queue = f"queue {handed.queue!r}" if handed.queue else "its queue"
        return (
            f"{nodes} consumes {queue} with another saga store ({store}), which does not hold "
            f"this run, and {so_far}: a worker of another deployment shares the queue; start "
            "a worker of this store on it, and give each deployment queues (or a broker vhost) "
            "of its own"
        )
    if handed.reason is HandBackReason.UNKNOWN_TASK:
        return (
            f"{nodes} does not have task {handed.task!r} and {so_far}: a worker that has not "
            f"imported the module registering saga {handed.saga!r} cannot run it; import that "
            "module in every worker, or call engine.autodiscover_sagas() where the Celery app "
            "is defined"
        )
    return (
        f"{nodes} does not have version {handed.version} of saga {handed.saga!r} and {so_far}; "
        "start a worker that has it (`celery saga versions` shows where each version runs)"
    )
