"""Publishing node and compensate messages.

A step's message is its own Celery task's message (see ``step_tasks``): the task's name,
queue and routes, priority, serializer and time limits (a step's ``timeout`` overrides the
soft limit), with the saga coordinates in the ``celery_saga`` header and no arguments (the
wrapper maps them from the context after admission). The next attempt of the same step,
and a message sent again, keep the task id, as Celery's own retries do. Nodes that run no
step of the user's (a wait, a sub-saga) are the engine's ``celery_saga.node`` task, shown
under a readable ``shadow`` name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError as BrokerUnreachable

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import StepRetryRequested, VersionNotDeployedError
from celery_saga.runtime.invoke import running_body
from celery_saga.tracing.carry import TRACE, carry_on
from celery_saga.worker.eager import EagerRunner
from celery_saga.worker.saga_header import (
    HEADER,
    REVERSES,
    STORE,
    VERSION,
    describe,
    node_header,
    reversal_header,
)
from celery_saga.worker.sealed_commands import seal_arguments
from celery_saga.worker.step_tasks import StepTasks, is_celery_task

NODE_TASK = "celery_saga.node"
COMPENSATE_TASK = "celery_saga.compensate"
RECOVER_TASK = "celery_saga.recover"
FIRE_TIMERS_TASK = "celery_saga.fire_timers"
CLEANUP_TASK = "celery_saga.cleanup"
ARCHIVE_TASK = "celery_saga.archive"
COMMAND_TASK = "celery_saga.command"


logger = logging.getLogger("celery_saga")

#: What a publish raises when the broker cannot be reached (after kombu's own retries).
BROKER_ERRORS = (BrokerUnreachable, OSError)


class CeleryPublisher:
    """Sends the engine's messages. A message the broker refuses is handed to ``on_unsent``
    (execution id, error): the transition it follows is already recorded, so the engine
    marks the run as owed a message instead of failing the task that recorded it."""

    def __init__(
        self,
        app: Celery,
        on_unsent: Callable[[str, Exception], None] | None = None,
        hard_limit_grace: float = 10.0,
        compensation_timeout: float = 30.0,
        tasks: StepTasks | None = None,
    ) -> None:
        self.app = app
        self.tasks = tasks
        self.eager = EagerRunner(app)
        self.on_unsent = on_unsent
        self.hard_limit_grace = hard_limit_grace
        self.compensation_timeout = compensation_timeout
        #: The store this process's runs live in, named in each message it sends.
        self.store: str | None = None

    def _limits(self, options: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """A step's ``timeout`` becomes the message's soft time limit, with a hard limit
        ``hard_limit_grace`` later, so the pool stops the body (see runtime/timeouts.py)."""
        if timeout:
            options["soft_time_limit"] = timeout
            options["time_limit"] = timeout + self.hard_limit_grace
        return options

    def send(self, execution_id: str, name: str, **options: Any) -> None:
        """Send one message of the run ``execution_id`` (run in place under
        ``task_always_eager``)."""
        self._name_store(options.get("headers"))
        _carry_trace(options.get("headers"))
        if self.app.conf.task_always_eager:
            self.eager.send(name, options)
            return
        try:
            self.app.send_task(name, **options)
        except BROKER_ERRORS as error:
            if self.on_unsent is None:
                raise
            self.on_unsent(execution_id, error)

    def _name_store(self, headers: dict[str, Any] | None) -> None:
        """The message names the store of its run; one sent again keeps the name it has."""
        header = None if self.store is None or headers is None else headers.get(HEADER)
        if isinstance(header, dict):
            headers[HEADER] = {STORE: self.store, **header}  # type: ignore[index]

    def _options(self, target: Any, readable_name: str) -> dict[str, Any]:
        if not is_celery_task(target):
            queue = self.app.conf.get("saga_queue")
            return {"shadow": readable_name, **({"queue": queue} if queue else {})}
        preferred = {"queue": target.queue} if getattr(target, "queue", None) else {}
        options: dict[str, Any] = dict(self.app.amqp.router.route(preferred, target.name))
        options["shadow"] = target.name
        for limit in ("time_limit", "soft_time_limit"):
            value = getattr(target, limit, None)
            if value:
                options[limit] = value
        return options

    def queue_for(self, target: Any) -> str:
        """The name of the queue a message for ``target`` (a task, a plain callable or
        None for the engine's own nodes) is sent to."""
        routed = self._options(target, "-").get("queue")
        if routed is None:
            return str(self.app.conf.task_default_queue)
        return str(getattr(routed, "name", routed))  # the router may give a Queue

    def publish_node(
        self,
        saga_name: str,
        spec: StepSpec | None,
        message: NodeMessage,
        countdown: float | None = None,
        label: str | None = None,
        version: str | None = None,
    ) -> None:
        task = self.tasks.task_for(saga_name, spec) if self.tasks and spec else None
        header = node_header(saga_name, message, version)
        if task is not None and spec is not None:
            self._send_step(task, header, message.attempt, countdown, spec.timeout)
            return
        target = spec.action if spec else None
        name = label or (f"{saga_name}.{spec.name}" if spec else saga_name)
        self.send(
            message.execution_id,
            NODE_TASK,
            args=[
                message.execution_id,
                saga_name,
                message.node,
                message.sub,
                message.member,
                message.attempt,
            ],
            kwargsrepr=describe(header),
            headers={HEADER: header},
            countdown=countdown,
            **self._limits(self._options(target, name), spec.timeout if spec else None),
        )

    def publish_compensation(
        self,
        saga_name: str,
        spec: StepSpec | None,
        execution_id: str,
        step_name: str,
        attempt: int,
        countdown: float | None = None,
        version: str | None = None,
    ) -> None:
        target = spec.compensation if spec else None
        timeout = (spec.compensation_timeout if spec else None) or self.compensation_timeout
        task = self.tasks.task_for(saga_name, spec, "reversal") if self.tasks and spec else None
        header = reversal_header(saga_name, execution_id, step_name, attempt, version)
        if task is not None:
            self._send_step(task, header, attempt, countdown, timeout, _unwind_root())
            return
        self.send(
            execution_id,
            COMPENSATE_TASK,
            args=[execution_id, step_name, attempt],
            kwargsrepr=describe(header),
            headers={HEADER: header},
            countdown=countdown,
            **_unwind_root(),
            **self._limits(self._options(target, f"{saga_name}.{step_name}.compensate"), timeout),
        )

    def hand_on(
        self, missing: VersionNotDeployedError, execution_id: str, command: str, **arguments: Any
    ) -> None:
        """A call on a run (``signal``, ``resume``, ``cancel``) in a process without the
        run's version: send it as a ``celery_saga.command`` message for a worker that has
        it (guarantee 22). Under ``task_always_eager`` there is no such worker: it raises.
        With a payload codec the arguments (a payload, the actor) travel sealed."""
        if self.app.conf.task_always_eager:
            raise missing
        header = {"id": execution_id, "saga": missing.saga_name, VERSION: missing.definition_hash}
        headers = {HEADER: header}
        self._name_store(headers)
        self.app.send_task(  # a broker error reaches the caller, who stored nothing for it
            COMMAND_TASK,
            args=[execution_id, command, seal_arguments(execution_id, command, arguments)],
            headers=headers,
            argsrepr=repr([execution_id, command]),  # a signal's payload stays out of logs
            **self._options(None, f"{missing.saga_name}.{command}"),
        )
        logger.info(
            "execution %s runs version %s of saga %r, which this process lacks: its %s is "
            "handed on to a worker that has it",
            execution_id,
            missing.definition_hash,
            missing.saga_name,
            command,
        )

    def _send_step(
        self,
        task: Any,
        header: dict[str, Any],
        attempt: int,
        countdown: float | None,
        timeout: float | None,
        root: dict[str, str] | None = None,
    ) -> None:
        options: dict[str, Any] = {
            **(root or {}),
            "args": (),
            "kwargs": {},
            "headers": {HEADER: header},
            "retries": attempt - 1,  # ``self.request.retries`` counts the saga's attempts
            "countdown": countdown,
            "expires": None,  # a step is never dropped by the broker
            "kwargsrepr": describe(header),
        }
        task_id = _same_message_id(task.name, header)
        if task_id is not None:
            options["task_id"] = task_id
        self.send(str(header["id"]), task.name, **self._limits(options, timeout))


_ATTEMPT_FIELDS = ("attempt", "resent", "handed", TRACE)


def _carry_trace(headers: dict[str, Any] | None) -> None:
    """The message carries the trace of the run whose message or start sends it."""
    header = None if headers is None else headers.get(HEADER)
    if isinstance(header, dict):
        carry_on(header)


def _unwind_root() -> dict[str, str]:
    """A reversal sent by a step's own task (the attempt whose end started the unwind) has
    that task as its Celery root, so Flower shows the unwind under the failed step; later
    reversals inherit the root from the one before, as Celery does. Anywhere else (a sweep,
    a resume) Celery's own rule applies (tests/test_flower.py)."""
    body = running_body.get()
    if body is None or body.task_id is None or body.header is None or REVERSES in body.header:
        return {}
    return {"root_id": body.task_id}


def _same_message_id(task_name: str, header: dict[str, Any]) -> str | None:
    """The task id of the message now running, when ``header`` is the attempt its task
    asked for with ``self.retry()``, or a resend of the same message: its ``AsyncResult``
    then follows it, as with Celery's retries."""
    body = running_body.get()
    if body is None or body.header is None or body.task_name != task_name:
        return None
    if body.error is not None and not isinstance(body.error, StepRetryRequested):
        return None  # the body raised: that task FAILED, the next attempt is a new task
    same = all(
        body.header.get(key) == value for key, value in header.items() if key not in _ATTEMPT_FIELDS
    )
    return body.task_id if same else None
