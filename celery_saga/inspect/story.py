"""A stored run made into the read model (``values.RunView``): its steps with their
reversals and child runs, its graph (``graph.build``) and its timeline (``chronology``,
``bars``). Pure: the store is read through ``load``, definitions found through ``find``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import (
    BranchNode,
    ForEachNode,
    LoopNode,
    ParallelNode,
    SubSagaNode,
    WaitNode,
    split_iteration,
)
from celery_saga.definition.run_markings import FindDefinition
from celery_saga.inspect import bars, chronology, graph, waiting
from celery_saga.inspect.values import (
    MissingChild,
    ReversalView,
    RunView,
    StepView,
    Timeline,
    Within,
)
from celery_saga.records import (
    DoorPlace,
    ExecutionRecord,
    ExecutionState,
    QueuePlace,
    StepRecord,
)
from celery_saga.store.history import Kind
from celery_saga.store.inspection import StoredRun

#: How deep a run's child runs are followed; sub-sagas may nest, a cycle cannot be registered.
MAX_DEPTH = 8
LoadRun = Callable[[str], "StoredRun | None"]

_GROUPS: tuple[tuple[type[Any], str], ...] = (
    (ParallelNode, "parallel"),
    (BranchNode, "branch"),
    (LoopNode, "loop"),
    (ForEachNode, "for_each"),
    (SubSagaNode, "sub_saga"),
)


def _within(definition: SagaDefinition | None, node: int) -> Within | None:
    """The group a step ran in: a parallel group, a branch, a loop, or a sub-saga."""
    if definition is None or not 0 <= node < len(definition.nodes):
        return None
    target = definition.nodes[node]
    for kind, label in _GROUPS:
        if isinstance(target, kind):
            return Within(label, str(getattr(target, "name", "")))
    return None


def _reversal(record: StepRecord, earlier: int) -> ReversalView | None:
    """The step's reversal; ``earlier``: its attempts before a resume reset them."""
    if record.compensation_status is None and not record.compensation_attempts and not earlier:
        return None
    status = record.compensation_status
    held = record.compensation_lease_expires_at is not None
    return ReversalView(
        status=status.value if status is not None else None,
        reason=record.compensation_reason,
        attempts=record.compensation_attempts,
        total_attempts=record.compensation_attempts + earlier,
        at=record.compensated_at,
        holder=record.compensation_holder if held else None,
    )


def _step(
    record: StepRecord,
    definition: SagaDefinition | None,
    earlier: dict[str, int],
    child: Callable[[str], RunView | MissingChild],
) -> StepView:
    base, iteration = split_iteration(record.name)
    return StepView(
        name=record.name,
        step=base,
        iteration=iteration,
        node=record.node,
        within=_within(definition, record.node),
        status=record.status.value,
        attempts=record.attempts,
        idempotency_key=record.idempotency_key,
        started_at=record.started_at,
        completed_at=record.completed_at,
        error=record.error,
        result=record.result,
        holder=record.holder if record.lease_expires_at is not None else None,
        compensatable=record.compensatable,
        compensation=_reversal(record, earlier.get(record.name, 0)),
        child=None if record.child_execution_id is None else child(record.child_execution_id),
    )


def gate_event(definition: SagaDefinition | None, record: ExecutionRecord) -> str | None:
    """The event a waiting run waits for, from its definition (None: not waiting, or its
    version is not registered here)."""
    if record.state is not ExecutionState.WAITING or definition is None:
        return None
    nodes = definition.nodes
    gate = nodes[record.cursor] if 0 <= record.cursor < len(nodes) else None
    return gate.event if isinstance(gate, WaitNode) else None


def _waited_event(run: StoredRun, definition: SagaDefinition | None) -> str | None:
    """The waiting run's event: its gate, else its history's last ``wait-entered`` row."""
    if run.record.state is not ExecutionState.WAITING:
        return None
    gate = gate_event(definition, run.record)
    if gate is not None:
        return gate
    entered = [h.data for h in run.history if h.kind == "wait-entered"]
    return str(entered[-1]["event"]) if entered and isinstance(entered[-1], dict) else None


def _paused_at(run: StoredRun) -> tuple[str, str] | None:
    """The step and reason of the pause a held run was last held at, from its history."""
    if run.record.state is not ExecutionState.HELD:
        return None
    for row in reversed(run.history):
        if row.kind in (Kind.PAUSED.value, Kind.UNPAUSED.value, Kind.HELD.value):
            paused = row.kind == Kind.PAUSED.value and row.step is not None
            return (row.step or "", row.detail or "") if paused else None
    return None


def describe(
    run: StoredRun,
    load: LoadRun,
    find: FindDefinition,
    *,
    waiting_for_version: str | None = None,
    queued_behind: QueuePlace | None = None,
    at_door: DoorPlace | None = None,
    depth: int = 0,
) -> RunView:
    """Everything stored about ``run``, its child runs (read through ``load``) nested
    under their steps."""
    record = run.record
    definition = find(record.saga_name, record.definition_hash)

    def child(execution_id: str) -> RunView | MissingChild:
        found = load(execution_id) if depth < MAX_DEPTH else None
        if found is None:
            return MissingChild(execution_id)
        return describe(found, load, find, depth=depth + 1)

    earlier = chronology.earlier_reversal_attempts(run.history)
    steps = tuple(_step(s, definition, earlier, child) for s in run.steps)
    signals = tuple(run.signals)
    event = _waited_event(run, definition)
    running_child = waiting.running_child(steps, record.cursor)
    until = record.wake_at.isoformat() if record.wake_at is not None else None
    hold = waiting.hold_of(record, steps)
    bars_of, waits = bars.timeline_bars(steps, run.history)
    return RunView(
        record=record,
        definition_deployed=definition is not None and definition.hash == record.definition_hash,
        archived_at=run.archived_at,
        signals=signals,
        steps=steps,
        history=run.history,
        waiting_for_event=event,
        waiting_for_version=waiting_for_version,
        waiting=waiting.reason(
            record.state.value,
            event=event,
            until=until,
            version=waiting_for_version,
            child=running_child,
            held=None if hold is None else hold.step,
            paused=_paused_at(run),
            queued=queued_behind,
            door=at_door,
        ),
        graph=graph.build(definition, record, steps, signals, run.history),
        timeline=Timeline(chronology.entries(record, steps, signals, run.history), bars_of, waits),
        hold=hold,
        labels=run.labels,
    )
