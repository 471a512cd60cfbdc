"""Where a node message points: the step (and record) at a position, and the control-flow
choices that decide it, each journaled before anything it selects runs (guarantee 12)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import Advance, advance
from celery_saga.decisions.loops import (
    LoopVerdict,
    condition_problem,
    for_each_verdict,
    items_problem,
    loop_position,
    loop_verdict,
    needs_condition,
)
from celery_saga.definition import nodes
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import Node, StepSpec, iteration_name
from celery_saga.errors import BranchPathError, LoopError, SagaError
from celery_saga.records import ExecutionRecord, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context_builder import Snapshot, run_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import unreachable
from celery_saga.runtime.saga_context import SagaContext
from celery_saga.store import queries
from celery_saga.store.database import Database

#: The path length of a conditional loop: its end is decided one iteration at a time.
OPEN_ENDED = sys.maxsize


@dataclass(frozen=True)
class Position:
    """What runs at a position: ``spec`` under the record ``record_name``, on a path of
    ``length`` positions. ``spec`` None: the node is finished here (a loop that ended)."""

    spec: StepSpec | None
    record_name: str = ""
    length: int = 1
    iteration: int | None = None
    item: Any = None
    for_each: bool = False


def next_position(definition: SagaDefinition, node: int, sub: int, path_length: int = 1) -> Advance:
    """Where a run of ``definition`` goes after ``(node, sub)`` (``decisions.cursor``); a run
    under a flow-control limit that finishes there gives its slot back as it ends."""
    target = advance(definition.nodes, node, sub, path_length)
    if target.finished and definition.concurrency is not None:
        return replace(target, releases_slot=True)
    return target


def node_at(definition: SagaDefinition, message: NodeMessage) -> Node | None:
    """The node a message names in the deployed graph, if it names one (a redeploy may have
    shrunk the graph; the checked path then reports the changed definition)."""
    if message.node >= len(definition.nodes):
        return None
    target = definition.nodes[message.node]
    if isinstance(target, nodes.ParallelNode) and message.member >= len(target.steps):
        return None
    return target


def route(target: Node, sub: int, member: int) -> StepSpec | None:
    """The step whose queue, name and limits a message for this position takes, where that
    needs no choice (not for a branch); None for the engine's own control nodes."""
    match target:
        case nodes.StepNode() | nodes.ForEachNode():
            return target.step
        case nodes.ParallelNode():
            return target.steps[member]
        case nodes.LoopNode():
            return target.steps[sub % len(target.steps)]
        case nodes.BranchNode() | nodes.PivotNode() | nodes.WaitNode() | nodes.SubSagaNode():
            return None
        case _:
            unreachable(target)


def record_at(definition: SagaDefinition, message: NodeMessage) -> str | None:
    """The record a message's position runs under, where no journaled choice decides it
    (not for a branch); None for the engine's own control nodes. ``resolve`` names the
    same record."""
    match node_at(definition, message):
        case nodes.StepNode() | nodes.ParallelNode() as target:
            spec = route(target, 0, message.member)
            return None if spec is None else spec.name
        case nodes.ForEachNode() as target:
            return iteration_name(target.step.name, message.sub)
        case nodes.LoopNode() as target:
            iteration, index = loop_position(message.sub, len(target.steps))
            return iteration_name(target.steps[index].name, iteration)
        case _:
            return None  # none, or a node whose record a choice decides, or none runs


def resolve(
    db: Database, definition: SagaDefinition, snapshot: Snapshot | None, message: NodeMessage
) -> Position:
    """The position a message names; journals (or reads) the choices that decide it.
    ``snapshot``: the run with all its steps, if read already; a choice that has to be
    made reads it (a journaled one does not)."""
    target = definition.nodes[message.node]
    execution_id, node, sub = message.execution_id, message.node, message.sub
    match target:
        case nodes.BranchNode():
            chosen = choose_path(db, definition, target, execution_id, node, snapshot)
            path = target.paths[chosen]
            return Position(path[sub], path[sub].name, len(path))
        case nodes.LoopNode():
            return _loop_position(db, definition, target, snapshot, message)
        case nodes.ForEachNode():
            items = for_each_items(db, definition, target, node, execution_id, snapshot)
            if for_each_verdict(sub, len(items)) is LoopVerdict.DONE:
                return Position(None)
            name = iteration_name(target.step.name, sub)
            return Position(target.step, name, len(items), sub, items[sub], for_each=True)
        case _:
            spec = route(target, sub, message.member)
            assert spec is not None
            return Position(spec, spec.name)


def _loaded(
    db: Database, execution_id: str, snapshot: Snapshot | None
) -> tuple[ExecutionRecord, list[StepRecord]]:
    execution, steps = snapshot or queries.load_snapshot(db, execution_id)
    assert execution is not None
    return execution, steps


def _loop_position(
    db: Database,
    definition: SagaDefinition,
    loop: nodes.LoopNode,
    snapshot: Snapshot | None,
    message: NodeMessage,
) -> Position:
    iteration, index = loop_position(message.sub, len(loop.steps))
    if index == 0:
        condition = None
        if needs_condition(loop.kind, iteration):
            condition = loop_condition(
                db, definition, loop, (message.execution_id, message.node), iteration, snapshot
            )
        verdict = loop_verdict(loop.kind, iteration, condition, loop.max_iterations)
        if verdict is LoopVerdict.EXCEEDED:
            raise LoopError(
                f"saga {definition.name!r}: {loop.kind.value} {loop.name!r} wanted iteration "
                f"{iteration + 1}, beyond max_iterations={loop.max_iterations}"
            )
        if verdict is LoopVerdict.DONE:
            return Position(None)
    spec = loop.steps[index]
    return Position(spec, iteration_name(spec.name, iteration), OPEN_ENDED, iteration)


def journaled(db: Database, execution_id: str, key: str, compute: Any, what: str) -> Any:
    """The value journaled under ``key``, or ``compute()`` journaled now (first writer wins)."""
    found = queries.load_decision(db, execution_id, key)
    if found is not None:
        return found[0]
    value = compute()
    return queries.journal_decision(db, execution_id, key, value, get_clock().now(), what=what)


def ask(
    db: Database,
    definition: SagaDefinition,
    snapshot: tuple[ExecutionRecord, list[StepRecord]],
    function: Callable[[SagaContext], Any],
    *,
    name: str,
    what: str,
    error: type[SagaError],
    iteration: int | None = None,
) -> Any:
    """Call a control-flow callable (selector, condition, items, input mapper) with the
    run's context; what it raises becomes ``error`` naming ``what``."""
    execution, steps = snapshot
    ctx = run_context(
        db,
        definition,
        execution,
        steps,
        step_name=name,
        key=record_key(execution.id, name, "forward"),
        iteration=iteration,
    )
    try:
        return function(ctx)
    except Exception as raised:
        raise error(f"{what} raised {describe_error(raised)}") from raised


def loop_condition(
    db: Database,
    definition: SagaDefinition,
    loop: nodes.LoopNode,
    at: tuple[str, int],
    iteration: int,
    snapshot: Snapshot | None,
) -> bool:
    """Journaled ``loop:<node>:<iteration>`` of the run and node ``at``: the condition
    checked before that iteration (for do_until, after the one before it)."""
    what = f"saga {definition.name!r}: the condition of {loop.kind.value} {loop.name!r}"

    execution_id, node = at

    def compute() -> bool:
        value = ask(
            db,
            definition,
            _loaded(db, execution_id, snapshot),
            loop.condition,
            name=loop.name,
            what=what,
            error=LoopError,
            iteration=iteration,
        )
        problem = condition_problem(value)
        if problem is not None:
            raise LoopError(f"{what} {problem}")
        return bool(value)

    key = f"loop:{node}:{iteration}"
    return bool(journaled(db, execution_id, key, compute, f"{what} (iteration {iteration})"))


def for_each_items(
    db: Database,
    definition: SagaDefinition,
    loop: nodes.ForEachNode,
    node: int,
    execution_id: str,
    snapshot: Snapshot | None,
) -> list[Any]:
    """Journaled ``items:<node>``: the list a for_each walks, fixed before its first item."""
    what = f"saga {definition.name!r}: the items of for_each {loop.name!r}"

    def compute() -> list[Any]:
        loaded = _loaded(db, execution_id, snapshot)
        value = ask(db, definition, loaded, loop.items, name=loop.name, what=what, error=LoopError)
        problem = items_problem(value, loop.max_iterations)
        if problem is not None:
            raise LoopError(f"{what} {problem}")
        return list(value)

    return list(journaled(db, execution_id, f"items:{node}", compute, what))


def choose_path(
    db: Database,
    definition: SagaDefinition,
    branch: nodes.BranchNode,
    execution_id: str,
    node: int,
    snapshot: Snapshot | None = None,
) -> str:
    """Journal the branch choice before anything it selects runs (guarantee 12)."""
    what = f"saga {definition.name!r}, branch {branch.name!r}"

    def compute() -> str:
        loaded = _loaded(db, execution_id, snapshot)
        choice = ask(
            db,
            definition,
            loaded,
            branch.selector,
            name=branch.name,
            what=f"{what}: selector",
            error=BranchPathError,
        )
        if choice not in branch.paths:
            raise BranchPathError(
                f"{what}: selector returned {choice!r}; defined paths are {sorted(branch.paths)}"
            )
        return str(choice)

    return str(journaled(db, execution_id, f"branch:{node}", compute, f"choice of {what}"))
