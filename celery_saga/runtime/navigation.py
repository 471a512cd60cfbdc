"""Where a node message points: the step at a position, branch choices, graph lookups."""

from __future__ import annotations

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import BranchNode, Node, ParallelNode, StepSpec
from celery_saga.errors import BranchPathError
from celery_saga.records import completed_results
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context import SagaContext
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.keys import idempotency_key
from celery_saga.store import queries
from celery_saga.store.database import Database


def node_at(definition: SagaDefinition, message: NodeMessage) -> Node | None:
    """The node a message names in the deployed graph, if it names one (a redeploy may have
    shrunk the graph; the checked path then reports the changed definition)."""
    if message.node >= len(definition.nodes):
        return None
    target = definition.nodes[message.node]
    if isinstance(target, ParallelNode) and message.member >= len(target.steps):
        return None
    return target


def resolve(
    db: Database, definition: SagaDefinition, execution_id: str, node: int, sub: int, member: int
) -> tuple[StepSpec, int]:
    """The step at a position and the length of the path it is on."""
    target = definition.nodes[node]
    if isinstance(target, ParallelNode):
        return target.steps[member], 1
    if isinstance(target, BranchNode):
        path = target.paths[choose_path(db, definition, target, execution_id, node)]
        return path[sub], len(path)
    return target.step, 1  # type: ignore[union-attr]


def choose_path(
    db: Database, definition: SagaDefinition, branch: BranchNode, execution_id: str, node: int
) -> str:
    """Journal the branch choice before anything it selects runs (guarantee 12)."""
    key = f"branch:{node}"
    journaled = queries.load_decision(db, execution_id, key)
    if journaled is not None:
        return str(journaled[0])
    execution, steps = queries.load_snapshot(db, execution_id)
    assert execution is not None
    ctx = SagaContext(
        execution_id,
        definition.name,
        branch.name,
        execution.input,
        completed_results(steps),
        idempotency_key(execution_id, branch.name, 0, "forward"),
        1,
    )
    try:
        choice = branch.selector(ctx)
    except Exception as error:
        raise BranchPathError(
            f"saga {definition.name!r}, branch {branch.name!r}: selector raised "
            f"{describe_error(error)}"
        ) from error
    if choice not in branch.paths:
        raise BranchPathError(
            f"saga {definition.name!r}, branch {branch.name!r}: selector returned "
            f"{choice!r}; defined paths are {sorted(branch.paths)}"
        )
    return str(queries.journal_decision(db, execution_id, key, choice, get_clock().now()))
