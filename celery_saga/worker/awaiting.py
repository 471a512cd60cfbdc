"""What a run that ``SagaHandle.wait()`` gave up on is waiting for, in one clause.

A step message that no worker takes is the usual first-day stall: either no worker consumes
its queue (``stall_hints`` names such queues), or a worker that never imported the module
registering the saga received it and dropped it as an unregistered task; Celery only logs
that on the worker. The store shows which: no claim on the step its cursor points at. A
worker of the engine hands such a message back instead, and marks the run as waiting for
its version when its store holds it; what the workers say about it (``hand_back_notes``)
then explains the stall better than a guess.
"""

from __future__ import annotations

from celery_saga.definition.nodes import StepSpec, node_steps
from celery_saga.records import Execution, ExecutionState, StepRecord, StepStatus
from celery_saga.runtime.catalog import Catalog
from celery_saga.worker.step_tasks import StepTasks


def _untaken(saga: str, what: str, task: str | None, explained: bool) -> str:
    named = f" {task!r}" if task else ""
    if explained:  # the workers said why (``hand_back_notes``)
        return f"{what}, whose task{named} no worker has taken"
    return (
        f"{what}, whose task{named} no worker has taken: a worker that has not imported the "
        f"module registering saga {saga!r} drops it (its log says 'Received unregistered "
        "task'); import that module in every worker, or call engine.autodiscover_sagas() "
        "where the Celery app is defined"
    )


def _task_name(tasks: StepTasks, saga: str, spec: StepSpec, kind: str) -> str | None:
    task = tasks.task_for(saga, spec, kind)
    return None if task is None else str(task.name)


def _forward(catalog: Catalog, tasks: StepTasks, execution: Execution, explained: bool) -> str:
    record, saga = execution.record, execution.record.saga_name
    definition = catalog.known(saga)
    nodes = definition.nodes if definition is not None else ()
    specs = node_steps(nodes[record.cursor]) if 0 <= record.cursor < len(nodes) else ()
    here = [s for s in execution.steps if s.node == record.cursor]
    running = [s for s in here if s.status is StepStatus.RUNNING]
    if running:
        return f"at step {running[0].name!r}, attempt {running[0].attempts}, claimed by a worker"
    pending = [s for s in here if s.status is StepStatus.PENDING]
    version = execution.waiting_for_version
    if pending:
        what = f"at step {pending[0].name!r}, waiting for attempt {pending[0].attempts + 1}"
        return _version_wait(saga, what, version) or _untaken(saga, what, None, explained)
    if not here and len(specs) == 1:
        task = _task_name(tasks, saga, specs[0], "forward")
        what = f"at step {specs[0].name!r}"
        if version is not None:
            what = _untaken(saga, what, task, explained=True)
        return _version_wait(saga, what, version) or _untaken(saga, what, task, explained)
    return _version_wait(saga, f"at node {record.cursor}", version) or f"at node {record.cursor}"


def _version_wait(saga: str, what: str, version: str | None) -> str | None:
    """A run marked as waiting for its version (a worker without it handed it back)."""
    if version is None:
        return None
    return (
        f"{what}: waiting for a worker with version {version} of saga {saga!r} (a worker "
        "without it handed the message back; `celery saga versions` shows where each runs)"
    )


def _next_reversal(steps: tuple[StepRecord, ...]) -> StepRecord | None:
    owed = [
        s
        for s in steps
        if s.compensatable
        and s.compensation_status is None
        and s.status in (StepStatus.COMPLETED, StepStatus.FAILED)
    ]
    return max(owed, key=lambda s: s.id, default=None)  # reverse start order


def _backward(execution: Execution, explained: bool) -> str:
    step = _next_reversal(execution.steps)
    if step is None:
        return "unwinding"
    what = f"unwinding, at the reversal of step {step.name!r}"
    if step.compensation_attempts:
        return f"{what}, after {step.compensation_attempts} attempt(s)"
    saga = execution.record.saga_name
    return _version_wait(saga, what, execution.waiting_for_version) or _untaken(
        saga, what, None, explained
    )


def waiting_for(
    catalog: Catalog, tasks: StepTasks, execution: Execution, explained: bool = False
) -> str:
    """Where the run stands and what would move it; "" when nothing more can be said.
    ``catalog`` and ``tasks`` name its step and that step's task; ``explained``: a hint
    from the workers says why no worker took its message."""
    if execution.state is ExecutionState.RUNNING:
        return _forward(catalog, tasks, execution, explained)
    if execution.state is ExecutionState.COMPENSATING:
        return _backward(execution, explained)
    if execution.state is ExecutionState.WAITING:
        return "waiting for a signal (engine.signal) or its deadline"
    return ""
