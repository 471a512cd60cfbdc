"""What a step's own task does when its message carries the saga header.

Admission, the claim and its lease, the body (called in place, under the task's own
request), the outcome record and the next message all happen inside the task's ``run``;
then the task ends the way the attempt did, so Celery's hooks, signals, events and result
backend see the truth: the recorded result, or the body's own exception (FAILURE, also for
an attempt the step's ``retry=`` runs again as a new task), or ``Retry`` when the task asked
for it with ``self.retry()`` (or ``autoretry_for``). A message that ran no body (a duplicate,
a held redelivery, a loop that passed) ends with ``Ignore``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Retry
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.errors import StepRetryRequested
from celery_saga.runtime.invoke import RunningBody, running_body
from celery_saga.runtime.limits import restore_soft_limit
from celery_saga.store.transient import describe_store_error, is_transient
from celery_saga.worker import outcome
from celery_saga.worker.saga_header import HEADER, node_message
from celery_saga.worker.step_tasks import GENERATED_FROM

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine
    from celery_saga.worker.publisher import CeleryPublisher

logger = logging.getLogger("celery_saga")

#: A message that met an unreachable store before doing anything is sent again after
#: these pauses (then left to the sweeps): an outage of minutes costs no run its progress.
STORE_RETRY_COUNTDOWNS = (1, 2, 4, 8, 15)
STORE_RETRY_MAX = 40


class StepRun:
    """The wrapper's saga path (see ``step_tasks``), for the engine ``engine``."""

    def __init__(self, engine: SagaEngine) -> None:
        self.engine = engine

    def __call__(self, task: Any, original: Any, header: dict[str, Any]) -> Any:
        request = task.request
        body = RunningBody(
            task.name,
            getattr(task, GENERATED_FROM, None),
            _in_place(task, original, request),
            task_id=request.id,
            header=header,
        )
        token = running_body.set(body)
        try:
            resends = int(header.get("resent", 0))
            send_again = _send_again(self.engine.publisher, task, header)
            with (
                sent_again_on_lost_store(task, resends, send_again),
                outcome.observed() as seen,
                self.engine.db.task_connection(),
            ):
                self.engine.ensure_schema()
                self._handle(header, _redelivered(request, header))
        finally:
            running_body.reset(token)
        verdict = seen.verdict()
        if not body.ran and verdict is None:
            self._ran_nothing(task)
        return _report(task, body, verdict)

    def _ran_nothing(self, task: Any) -> None:
        """A duplicate, a held redelivery, a loop that ended: Celery is told the message was
        ignored, so no success hook, signal or result claims a run that did not happen
        (``before_start`` and ``task_prerun`` came before anyone could know). Monitors are
        sent ``task-succeeded`` with no result, as Celery's own duplicate detection
        (``worker_deduplicate_successful_tasks``) leaves them, not a task left STARTED."""
        if self.engine.events.send_to_celery:
            task.send_event("task-succeeded", result="None", runtime=0.0)
        raise Ignore()

    def _handle(self, header: dict[str, Any], redelivered: bool) -> None:
        executor = self.engine.executor
        if "undo" in header:
            attempt = int(header["attempt"])
            executor.unwinder.run(
                str(header["id"]), str(header["undo"]), attempt, redelivered, str(header["saga"])
            )
        else:
            executor.run_node(node_message(header), str(header["saga"]), redelivered)


def _in_place(task: Any, original: Any, request: Any) -> Any:
    """Call the body with the mapped arguments under the message's request: the request's
    kwargs become those arguments (so ``on_success``, ``on_failure``, ``after_return``,
    ``task_postrun`` and ``task_failure`` see them), and a body run on a timeout thread
    still finds ``self.request``."""

    def call(kwargs: dict[str, Any]) -> Any:
        if isinstance(request.kwargs, dict):
            request.kwargs.update(kwargs)
        pushed = task.request_stack.top is not request
        if pushed:
            task.request_stack.push(request)
        try:
            return original(**kwargs)
        finally:
            if pushed:
                task.request_stack.pop()

    return call


def _report(task: Any, body: RunningBody, verdict: tuple[str, str, float] | None) -> Any:
    """End the task the way the attempt ended (its outcome is already stored)."""
    if verdict is None:
        return body.result
    event, text, countdown = verdict
    error = body.error
    cause = error.cause if isinstance(error, StepRetryRequested) else error
    if event == "retry" and (error is None or isinstance(error, StepRetryRequested)):
        # ``self.retry()`` asked for it: RETRY, as Celery's own retry, under the same id.
        raise Retry(text, exc=cause, when=countdown)
    # The body raised: the attempt is a FAILURE (``task_failure``, ``on_failure``,
    # ``after_return``), as for a plain call, even when the step's ``retry=`` runs it again
    # as a new task.
    if isinstance(error, StepRetryRequested) and cause is None:
        raise task.MaxRetriesExceededError(f"{text} (max_retries={error.max_retries})")
    if isinstance(cause, Exception):
        raise _from_user_code(cause)
    raise outcome.StepFailed(text)


def _from_user_code(error: BaseException) -> BaseException:
    """The body's exception with the engine's frames between this task and the user's code
    left out of its traceback, which then reads as a plain task's failure does. (Celery
    copies and formats every frame of it, for its log, ``task_failure``, the result backend
    and Flower: the engine's seven frames cost a failing task about 1 ms of its 8 ms of
    CPU.) An exception raised by the engine itself keeps its whole traceback."""
    tb = error.__traceback__
    while tb is not None and _engine_frame(tb.tb_frame):
        tb = tb.tb_next
    return error if tb is None else error.with_traceback(tb)


def _engine_frame(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith("celery_saga.")


def _redelivered(request: Any, header: dict[str, Any]) -> bool:
    """The broker hands this message out again, or the engine sent it again after the
    store failed under it: its own claim may be the live lease it meets."""
    if header.get("resent"):
        return True
    return bool((request.delivery_info or {}).get("redelivered"))


@contextmanager
def sent_again_on_lost_store(
    task: Any, resends: int, send_again: Callable[[int, SQLAlchemyError], BaseException]
) -> Iterator[None]:
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
    finally:
        restore_soft_limit()


def _send_again(publisher: CeleryPublisher, task: Any, header: dict[str, Any]) -> Any:
    """Send a step's message again, same task id, ``resent`` counting up."""
    resent = int(header.get("resent", 0))

    def send(countdown: int, error: SQLAlchemyError) -> BaseException:
        request = task.request
        hard, soft = request.timelimit or (None, None)
        limits = {"time_limit": hard, "soft_time_limit": soft} if hard or soft else {}
        publisher.send(
            str(header["id"]),
            task.name,
            args=(),
            kwargs={},
            headers={HEADER: {**header, "resent": resent + 1}},
            task_id=request.id,
            retries=request.retries or 0,
            countdown=countdown,
            expires=None,
            **limits,
        )
        unreachable = f"the saga store is unreachable: {describe_store_error(error)}"
        retry: BaseException = Retry(unreachable, exc=error, when=countdown)
        return retry

    return send
