"""Moving a run forward: storing a run, its first message, the message(s) of a position,
and what a committed move onward leads to. Each returns the move that follows (the
publish, or the end's notice) for ``Interpreter.carry_out``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import Advance, first_position
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.flow import key_of
from celery_saga.definition.nodes import (
    BranchNode,
    ForEachNode,
    LoopNode,
    ParallelNode,
    PivotNode,
    StepNode,
    SubSagaNode,
    WaitNode,
)
from celery_saga.errors import BranchPathError
from celery_saga.records import ExecutionState
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.moves import (
    FailRun,
    Move,
    MoveOn,
    PublishNode,
    PublishPosition,
    Settled,
    StartQueued,
    then,
    unreachable,
)
from celery_saga.runtime.navigation import choose_path, next_position, route
from celery_saga.runtime.outcomes import NoBody
from celery_saga.runtime.parts import Parts
from celery_saga.store import flow, forward, queries, recovery
from celery_saga.store.codec import pack
from celery_saga.store.flow import RunFlow

logger = logging.getLogger("celery_saga")


def create(
    parts: Parts,
    definition: SagaDefinition,
    saga_input: Any,
    execution_id: str,
    *,
    parent_execution_id: str | None = None,
    timeout: float | None = None,
    labels: Mapping[str, str] | None = None,
    trace_context: str | None = None,
) -> ExecutionState:
    """Store a new run at its first position (one INSERT; a taken id raises
    ``IntegrityError``); ``timeout`` (else the saga's) sets its deadline; ``labels``
    (checked) are stored with it; ``trace_context``: its root span's ``traceparent``
    (``celery_saga.tracing``). Returns the state stored: ``queued`` when its saga's
    flow-control limit holds it back (nothing to send)."""
    blob = pack(
        saga_input,
        what=f"input of saga {definition.name!r}",
        limit=parts.settings.max_payload_bytes,
    )
    first = first_position(definition.nodes)
    now = get_clock().now()
    seconds = timeout if timeout is not None else definition.timeout
    limit, flow = definition.concurrency, None
    if limit is not None:
        flow = RunFlow(key_of(definition.name, limit, saga_input), limit.max, limit.total)
    state = queries.create_execution(
        parts.db,
        execution_id=execution_id,
        saga_name=definition.name,
        definition_hash=definition.hash,
        input_blob=blob,
        node=first.node,
        sub=0,
        state=ExecutionState.RUNNING,
        committed=first.passes_pivot,
        now=now,
        parent_execution_id=parent_execution_id,
        deadline_at=None if seconds is None else now + timedelta(seconds=seconds),
        labels=labels,
        flow=flow,
        trace_context=trace_context,
    )
    if state is ExecutionState.QUEUED:
        assert flow is not None
        logger.info(
            "saga %r execution %s queued: no slot of key %r free (limit %d, saga total %s)",
            definition.name,
            execution_id,
            flow.key,
            flow.limit,
            flow.total,
        )
    return state


def launch(
    parts: Parts,
    definition: SagaDefinition,
    execution_id: str,
    parent_execution_id: str | None = None,
    announce: bool = True,
) -> Move:
    """The first message of a stored run (and, with ``announce``, its ``saga-started``
    event). A broker that refuses it leaves the run marked as owed a message (see
    ``CeleryPublisher``); the run is stored either way."""
    fields = {"execution_id": execution_id, "saga": definition.name}
    if parent_execution_id is not None:
        fields["parent_execution_id"] = parent_execution_id
    if announce:
        parts.emit("saga-started", fields)
    first = first_position(definition.nodes)
    return PublishPosition(definition, execution_id, first.node, 0)


def handed_on(parts: Parts, definition: SagaDefinition, freed_by: str) -> Move:
    """The first messages of the runs the run ``freed_by`` of ``definition`` handed its
    slot to as it ended (each claimed once: the timer sweep sends those a crash left
    behind), each in its own run's trace."""
    db, now = parts.db, get_clock().now()
    moves: list[Move] = []
    for run in flow.list_handed_on(db, definition.name, definition.hash, now):
        if recovery.claim_owed(
            db, execution_id=run.execution_id, seen_version=run.version, now=now
        ):
            logger.info("execution %s starts: a slot of its key was handed to it", run.execution_id)
            # a queued run's start is announced when it starts, not when it was stored
            fields = {"execution_id": run.execution_id, "saga": definition.name}
            parts.emit("saga-started", fields)
            position = (run.cursor, run.cursor_sub)
            queued = StartQueued(
                definition, run.execution_id, *position, run.trace_context, freed_by
            )
            moves.append(queued)
    return then(*moves)


def position_messages(
    parts: Parts, definition: SagaDefinition, execution_id: str, node: int, sub: int
) -> Move:
    """The message(s) of position (``node``, ``sub``): one per member of a parallel group;
    a branch whose path cannot be chosen fails its run instead."""
    message = NodeMessage(execution_id, node, sub, 0, 1)
    # Cases are tried in turn: a plain step's, the most frequent, first.
    match definition.nodes[node]:
        case StepNode() | LoopNode() | ForEachNode() | PivotNode() as target:
            return PublishNode(definition, message, spec=route(target, sub, 0))
        case ParallelNode() as group:
            return then(
                *(
                    PublishNode(
                        definition, NodeMessage(execution_id, node, 0, member, 1), spec=spec
                    )
                    for member, spec in enumerate(group.steps)
                )
            )
        case WaitNode() as gate:
            return PublishNode(definition, message, f"{definition.name}.wait:{gate.event}")
        case SubSagaNode() as child:
            return PublishNode(definition, message, f"{definition.name}.{child.name}")
        case BranchNode() as branch:
            try:
                path = branch.paths[choose_path(parts.db, definition, branch, execution_id, node)]
            except BranchPathError as error:
                return FailRun(definition, execution_id, describe_error(error))
            return PublishNode(definition, message, spec=path[sub])
        case other:
            unreachable(other)


def advanced(parts: Parts, definition: SagaDefinition, execution_id: str, onward: Advance) -> Move:
    """The run moved to ``onward`` (committed): publish it, or report the end."""
    if onward.finished:
        parts.emit("saga-completed", {"execution_id": execution_id, "saga": definition.name})
        return Settled(definition, execution_id)
    return PublishPosition(definition, execution_id, onward.node, onward.sub)


def pass_position(parts: Parts, definition: SagaDefinition, message: NodeMessage) -> MoveOn | None:
    """Nothing runs at this position (a loop or ``for_each`` ended, or had nothing to
    run): move past the node; None if the run no longer stands there."""
    onward = next_position(definition, message.node, 0)
    if not forward.pass_position(
        parts.db,
        execution_id=message.execution_id,
        node=message.node,
        sub=message.sub,
        advance=onward,
        now=get_clock().now(),
    ):
        return None
    passed: dict[str, Any] = {
        "execution_id": message.execution_id,
        "saga": definition.name,
        "node": message.node,
        "sub": message.sub,
        "version": definition.hash,
    }
    parts.emit("saga-node-passed", passed)
    return MoveOn(definition, message.execution_id, onward)


def refused(parts: Parts, message: NodeMessage, verdict_value: str) -> NoBody:
    """Drop a node message, logged and announced."""
    logger.info("node message %s refused: %s", message, verdict_value)
    parts.emit(
        "saga-message-refused",
        {"execution_id": message.execution_id, "node": message.node, "reason": verdict_value},
    )
    return NoBody(verdict_value)
