"""What both entry points (the engine's tasks and a step's own task) do around handling one
saga message: tell a redelivery from a first delivery, and send the message again when the
store cannot be reached under it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery.exceptions import WorkerShutdown, WorkerTerminate
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.hand_back import (
    HandBackReason,
    gives_up_on_absent_run,
    names_another_store,
)
from celery_saga.errors import PayloadKeyError, VersionNotDeployedError
from celery_saga.runtime.outcomes import Outcome
from celery_saga.runtime.timeouts import restore_soft_limit
from celery_saga.store.identity import holds_run
from celery_saga.store.transient import describe_store_error, is_transient
from celery_saga.tracing.carry import carried_by, carrying
from celery_saga.worker.hand_back_pool import drop_absent_run, hand_back_running
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.saga_header import HANDED, STORE, read_header, version_of

logger = logging.getLogger("celery_saga")

#: A message that met an unreachable store before doing anything is sent again after
#: these pauses (then left to the sweeps): an outage of minutes costs no run its progress.
STORE_RETRY_COUNTDOWNS = (1, 2, 4, 8, 15)
STORE_RETRY_MAX = 40

#: Sends the message again after ``countdown`` s and returns what the task raises.
SendAgain = Callable[[int, Exception], BaseException]


def redelivered(request: Any, resends: int) -> bool:
    """The broker hands this message out again (its consumer died before acking), or the
    engine sent it again after the store failed under it (``resends``): either way its own
    claim may be the live lease it meets, so it waits for that lease instead of being
    dropped."""
    if resends:
        return True
    return bool((request.delivery_info or {}).get("redelivered"))


def handle_message(
    parts: WorkerParts,
    task: Any,
    resends: int,
    send_again: SendAgain,
    handle: Callable[[bool], Outcome],
) -> Outcome:
    """Run ``handle(redelivered)`` on the task's store connection; a store that stays
    unreachable sends the message again (see ``sent_again_on_lost_store``), a run whose
    version this worker lacks, or that another store holds, gets its message handed back
    (``hand_back``)."""
    with sent_again_on_lost_store(task, resends, send_again), parts.db.task_connection():
        parts.store.ensure_schema()
        eager = parts.app.conf.task_always_eager  # no other worker to hand it to
        header = read_header(task.request)
        if header is not None and not eager and _another_stores_run(parts, header):
            if gives_up_on_absent_run(int(header.get(HANDED) or 0)):
                return drop_absent_run(parts, task, header)
            saga, version = str(header.get("saga")), version_of(header)
            return hand_back_running(parts, task, HandBackReason.RUN_NOT_IN_STORE, saga, version)
        try:
            with carrying(carried_by(header)):
                return handle(redelivered(task.request, resends))
        except VersionNotDeployedError as missing:
            if eager:
                raise
            saga, version = missing.saga_name, missing.definition_hash
            return hand_back_running(parts, task, HandBackReason.VERSION_NOT_HERE, saga, version)


def _another_stores_run(parts: WorkerParts, header: dict[str, Any]) -> bool:
    """The message names another store, and this one does not hold its run (a worker of
    another deployment shares the queue). Read only for a message naming another store."""
    if not names_another_store(header.get(STORE), parts.store_id):
        return False
    return not holds_run(parts.db, str(header["id"]))


@contextmanager
def sent_again_on_lost_store(task: Any, resends: int, send_again: SendAgain) -> Iterator[None]:
    """The store could not be reached after the in-process retries: the message is sent
    again after a short pause (``send_again(countdown, error)`` sends it and returns what to
    raise) instead of being left to the recovery sweep. Admission makes the resend harmless
    if the first one got through."""
    try:
        yield
    except SQLAlchemyError as error:
        if not is_transient(error) or resends >= STORE_RETRY_MAX:
            raise
        countdown = STORE_RETRY_COUNTDOWNS[min(resends, len(STORE_RETRY_COUNTDOWNS) - 1)]
        logger.warning(
            "%s: the saga store is unreachable (%s); this message is sent again in %d s",
            task.name,
            describe_store_error(error),
            countdown,
        )
        raise send_again(countdown, error) from error
    except PayloadKeyError as error:
        # Not the run's failure: this process lacks a key (its settings are behind the
        # others'). The message comes back after a pause, for this or another worker.
        if resends >= STORE_RETRY_MAX:
            raise
        countdown = STORE_RETRY_COUNTDOWNS[-1]
        logger.error("%s: %s; this message is sent again in %d s", task.name, error, countdown)
        raise send_again(countdown, error) from error
    finally:
        restore_soft_limit()


def stopped_by_worker(error: BaseException) -> bool:
    """Whether ``error`` is the worker's own shutdown reaching a body (the probe the runtime
    asks, ``runtime/stopping.py``): a pool process whose terminate handler fired (billiard
    unwinds the job with ``SystemExit`` from it, and records that it did), or Celery's own
    shutdown exceptions in a solo pool. A body's own ``sys.exit()`` is neither."""
    if isinstance(error, (WorkerShutdown, WorkerTerminate)):
        return True
    return _pool_terminating()


def _pool_terminating() -> bool:
    try:
        from billiard import common
    except ImportError:  # pragma: no cover - billiard comes with Celery
        return False
    fired = getattr(common, "terminate_handler_fired", None)
    if callable(fired):
        return bool(fired())
    flag = getattr(common, "_should_have_exited", None)  # billiard before 4.3
    return bool(flag and flag[0])
