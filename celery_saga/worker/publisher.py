"""Publishing node and compensate messages with the step's own queue, name and limits.

A Celery-task step is sent as the engine's node task with ``shadow`` set to the task's name,
on the queue the app's routing gives that task and with that task's time limits. The engine
task admits first and then calls the task's body in the same process, so a duplicate message
never reaches the body, while Flower, ``celery events`` and the logs show the user's task
name. (Publishing the user's task itself would need a wrapper around every task, and a worker
that lacked it would run the body without admission.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError as BrokerUnreachable

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.nodes import StepSpec

NODE_TASK = "celery_saga.node"
COMPENSATE_TASK = "celery_saga.compensate"
RECOVER_TASK = "celery_saga.recover"
FIRE_TIMERS_TASK = "celery_saga.fire_timers"
CLEANUP_TASK = "celery_saga.cleanup"
ARCHIVE_TASK = "celery_saga.archive"


def is_celery_task(target: Any) -> bool:
    return hasattr(target, "apply_async") and isinstance(getattr(target, "name", None), str)


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
    ) -> None:
        self.app = app
        self.on_unsent = on_unsent
        self.hard_limit_grace = hard_limit_grace
        self.compensation_timeout = compensation_timeout

    def _limits(self, options: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """A step's ``timeout`` becomes the message's soft time limit, with a hard limit
        ``hard_limit_grace`` later, so the pool stops the body (see runtime/limits.py)."""
        if timeout:
            options["soft_time_limit"] = timeout
            options["time_limit"] = timeout + self.hard_limit_grace
        return options

    def _send(self, execution_id: str, name: str, **options: Any) -> None:
        try:
            self.app.send_task(name, **options)
        except BROKER_ERRORS as error:
            if self.on_unsent is None:
                raise
            self.on_unsent(execution_id, error)

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
    ) -> None:
        target = spec.action if spec else None
        name = label or (f"{saga_name}.{spec.name}" if spec else saga_name)
        self._send(
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
    ) -> None:
        target = spec.compensation if spec else None
        timeout = (spec.compensation_timeout if spec else None) or self.compensation_timeout
        self._send(
            execution_id,
            COMPENSATE_TASK,
            args=[execution_id, step_name, attempt],
            countdown=countdown,
            **self._limits(self._options(target, f"{saga_name}.{step_name}.compensate"), timeout),
        )
