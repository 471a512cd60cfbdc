"""Publishing node and compensate messages with the step's own queue, name and limits.

A Celery-task step is sent as the engine's node task with ``shadow`` set to the task's name,
on the queue the app's routing gives that task and with that task's time limits. The engine
task admits first and then calls the task's body in the same process, so a duplicate message
never reaches the body, while Flower, ``celery events`` and the logs show the user's task
name. (Publishing the user's task itself would need a wrapper around every task, and a worker
that lacked it would run the body without admission.)
"""

from __future__ import annotations

from typing import Any

from celery import Celery

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


class CeleryPublisher:
    def __init__(self, app: Celery) -> None:
        self.app = app

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
        self.app.send_task(
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
            **self._options(target, name),
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
        self.app.send_task(
            COMPENSATE_TASK,
            args=[execution_id, step_name, attempt],
            countdown=countdown,
            **self._options(target, f"{saga_name}.{step_name}.compensate"),
        )
