"""What a step's own task does when its message carries the saga header.

Admission, the claim and its lease, the body (called in place, under the task's own
request), the outcome record and the next message all happen inside the task's ``run``;
then the task ends the way the attempt did, so Celery's hooks, signals, events and result
backend see the truth: the recorded result, or the body's own exception (FAILURE, also for
an attempt the step's ``retry=`` runs again as a new task), or ``Retry`` when the task asked
for it with ``self.retry()`` (or ``autoretry_for``). A message that ran no body (a duplicate,
a held redelivery, a loop that passed) ends with ``Ignore``, and so does a body its run's
cancel stopped (REVOKED, as the cancel's revoke left it).
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Retry
from sqlalchemy.exc import SQLAlchemyError

from celery_saga.runtime.invoke import RunningBody, running_body
from celery_saga.runtime.outcomes import Outcome
from celery_saga.store.transient import describe_store_error
from celery_saga.worker.delivery import handle_message
from celery_saga.worker.endings import end_task
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.publisher import CeleryPublisher
from celery_saga.worker.saga_header import HEADER, REVERSES, node_message, version_of
from celery_saga.worker.step_tasks import GENERATED_FROM


class StepRun:
    """The wrapper's saga path (see ``step_tasks``), for one engine's ``parts``."""

    def __init__(self, parts: WorkerParts) -> None:
        self.parts = parts

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
            send_again = _send_again(self.parts.publisher, task, header)
            outcome = handle_message(
                self.parts, task, resends, send_again, lambda again: self._handle(header, again)
            )
        finally:
            running_body.reset(token)
        # The body's frames may outlive the task (a traceback keeps them), and they keep
        # this frame as their caller: it must not keep what the body raised, or both stay
        # in a cycle until a full garbage collection (tests/test_failure_memory.py).
        body.error = None
        send_events = self.parts.events.send_to_celery
        try:
            return end_task(task, outcome, own_body=True, send_events=send_events)
        finally:
            del outcome, body

    def _handle(self, header: dict[str, Any], redelivered: bool) -> Outcome:
        executor = self.parts.executor
        if REVERSES in header:
            attempt = int(header["attempt"])
            return executor.unwinder.run(
                str(header["id"]),
                str(header[REVERSES]),
                attempt,
                redelivered,
                str(header["saga"]),
                version_of(header),
            )
        saga = str(header["saga"])
        return executor.run_node(node_message(header), saga, redelivered, version_of(header))


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


def _send_again(publisher: CeleryPublisher, task: Any, header: dict[str, Any]) -> Any:
    """Send a step's message again, same task id, ``resent`` counting up."""
    resent = int(header.get("resent", 0))

    def send(countdown: int, error: Exception) -> BaseException:
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
        why = (
            f"the saga store is unreachable: {describe_store_error(error)}"
            if isinstance(error, SQLAlchemyError)
            else str(error)
        )
        retry: BaseException = Retry(why, exc=error, when=countdown)
        return retry

    return send
