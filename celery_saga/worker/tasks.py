"""The two engine tasks every worker registers: run a node, run a reversal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_saga.decisions.admission import NodeMessage
from celery_saga.worker.publisher import COMPENSATE_TASK, NODE_TASK, RECOVER_TASK

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

#: Late ack + reject on worker loss: a SIGKILLed worker's message is redelivered, and
#: admission turns the redelivery into a resume instead of a second run.
_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
    "shared": False,
}


def register_tasks(app: Celery, engine: SagaEngine) -> None:
    @app.task(name=NODE_TASK, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_node(
        task: Any,
        execution_id: str,
        saga_name: str,
        node: int,
        sub: int,
        member: int,
        attempt: int,
    ) -> None:
        engine.ensure_schema()
        message = NodeMessage(execution_id, node, sub, member, attempt)
        engine.executor.run_node(message, saga_name, redelivered=_redelivered(task))

    @app.task(name=COMPENSATE_TASK, **_TASK_OPTIONS)  # type: ignore[untyped-decorator]
    def saga_compensate(task: Any, execution_id: str, step_name: str, attempt: int) -> None:
        engine.ensure_schema()
        engine.executor.unwinder.run(execution_id, step_name, attempt, _redelivered(task))

    @app.task(name=RECOVER_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def saga_recover() -> int:
        engine.ensure_schema()
        return engine.recover()


def _redelivered(task: Any) -> bool:
    """The broker is handing this message out again (its consumer died before acking)."""
    return bool((task.request.delivery_info or {}).get("redelivered"))
