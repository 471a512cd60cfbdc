"""Building the ``SagaContext`` a step, a compensation or a control-flow callable sees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ForEachNode, StepSpec, split_iteration
from celery_saga.records import ExecutionRecord, StepRecord, completed_results
from celery_saga.runtime.invoke import needs_context, needs_results
from celery_saga.runtime.saga_context import SagaContext
from celery_saga.store import queries
from celery_saga.store.database import Database
from celery_saga.store.reversal import Unwinding
from celery_saga.store.waits import load_signals

Snapshot = tuple[ExecutionRecord | None, list[StepRecord]]


def run_context(
    db: Database,
    definition: SagaDefinition,
    execution: ExecutionRecord,
    steps: Sequence[StepRecord],
    *,
    step_name: str,
    key: str,
    attempt: int = 1,
    iteration: int | None = None,
    item: Any = None,
    extra: Mapping[str, Any] | None = None,
    forward_key: str | None = None,
    forward_result: Any = None,
) -> SagaContext:
    """The context from a snapshot; signals are read only for sagas that wait for any."""
    return SagaContext(
        execution.id,
        definition.name,
        step_name,
        execution.input,
        completed_results(steps),
        key,
        attempt,
        forward_key=forward_key,
        forward_result=forward_result,
        extra=dict(extra or {}),
        signals=load_signals(db, execution.id) if definition.events else {},
        iteration=iteration,
        item=item,
    )


def loop_arguments(iteration: int | None, item: Any, for_each: bool) -> dict[str, Any]:
    """What a loop adds to the keyword arguments mapped for a task that takes no context."""
    if iteration is None:
        return {}
    return {"iteration": iteration, "item": item} if for_each else {"iteration": iteration}


def _without_run(
    execution_id: str,
    definition: SagaDefinition,
    record_name: str,
    key: str,
    attempt: int,
    loop: tuple[int | None, Any, bool],
    forward_key: str | None = None,
    forward_result: Any = None,
) -> SagaContext:
    """The context of a callable that needs neither the run's input nor its results.
    ``loop``: (iteration, item, is for_each) of a loop body step."""
    iteration, item, for_each = loop
    return SagaContext(
        execution_id,
        definition.name,
        record_name,
        None,
        {},
        key,
        attempt,
        forward_key=forward_key,
        forward_result=forward_result,
        extra=loop_arguments(iteration, item, for_each),
        iteration=iteration,
        item=item,
    )


def step_context(
    db: Database,
    definition: SagaDefinition,
    spec: StepSpec,
    record_name: str,
    execution_id: str,
    key: str,
    attempt: int,
    snapshot: Snapshot | None,
    loop: tuple[int | None, Any, bool] = (None, None, False),
) -> SagaContext:
    """The context for one attempt; the run is read only if the step needs it.
    ``loop``: (iteration, item, is for_each) of a loop body step."""
    iteration, item, for_each = loop
    if not needs_context(spec):
        return _without_run(execution_id, definition, record_name, key, attempt, loop)
    if snapshot is None and not needs_results(spec):
        # Given input keys only: the run row, not every step's (guarantee 32: an item of a
        # for_each reads as much at its 1,000th as at its first).
        run = queries.load_execution(db, execution_id)
        assert run is not None
        alone = _without_run(execution_id, definition, record_name, key, attempt, loop)
        return replace(alone, input=run.input)
    execution, steps = snapshot or queries.load_snapshot(db, execution_id)
    assert execution is not None
    return run_context(
        db,
        definition,
        execution,
        steps,
        step_name=record_name,
        key=key,
        attempt=attempt,
        iteration=iteration,
        item=item,
        extra=loop_arguments(iteration, item, for_each),
    )


def reversal_context(
    db: Database,
    definition: SagaDefinition,
    unwinding: Unwinding,
    record: StepRecord,
    key: str,
    attempt: int,
) -> SagaContext:
    """A reversal's context: its record's own result and key, and for a loop iteration its
    own iteration and (for_each) item; the input and results when the claim read the run."""
    iteration = split_iteration(record.name)[1]
    node = definition.nodes[record.node] if record.node < len(definition.nodes) else None
    for_each = isinstance(node, ForEachNode) and iteration is not None
    item = None
    if for_each:
        items = queries.load_decision(db, record.execution_id, f"items:{record.node}")
        assert iteration is not None
        item = items[0][iteration] if items is not None else None
    if unwinding.run is None:
        return _without_run(
            record.execution_id,
            definition,
            record.name,
            key,
            attempt,
            (iteration, item, for_each),
            forward_key=record.idempotency_key,
            forward_result=record.result,
        )
    return run_context(
        db,
        definition,
        unwinding.run,
        unwinding.steps,
        step_name=record.name,
        key=key,
        attempt=attempt,
        iteration=iteration,
        item=item,
        extra=loop_arguments(iteration, item, for_each),
        forward_key=record.idempotency_key,
        forward_result=record.result,
    )
