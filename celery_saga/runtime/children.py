"""A parent entering (and re-entering) its sub-saga node (guarantee 17).

The child's id is derived from the parent's and the node's name, so starting it twice is a
primary-key conflict: a re-entered node adopts the child it already started. The parent's
record of the child holds no lease and no worker: the child publishes the parent's node
when it settles.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from celery_saga.decisions.admission import Admission, NodeMessage
from celery_saga.decisions.children import ChildStep, child_failure, decide_child_step
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import SubSagaNode
from celery_saga.errors import PayloadError, SubSagaError, UnknownSagaError
from celery_saga.records import (
    Attempt,
    ExecutionRecord,
    StepRecord,
    StepStatus,
    completed_results,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context_builder import Snapshot
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import as_plain_mapping
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import (
    CompleteStep,
    FailRun,
    FailStep,
    Move,
    Refuse,
    StartChild,
    Stay,
)
from celery_saga.runtime.navigation import ask, journaled, next_position
from celery_saga.runtime.parts import Parts
from celery_saga.store import forward, queries
from celery_saga.store.codec import pack

_CHILD_IDS = uuid.UUID("6f1c2b8e-5d0a-4c8e-9a43-2b1f7c9d0e55")


def child_execution_id(parent_id: str, record_name: str) -> str:
    """The one id a parent's sub-saga node gives its child."""
    return str(uuid.uuid5(_CHILD_IDS, f"{parent_id}/{record_name}"))


class Children:
    """A parent's sub-saga nodes; returns the move for its owner to carry out."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def enter(
        self,
        definition: SagaDefinition,
        snapshot: Snapshot,
        message: NodeMessage,
        node: SubSagaNode,
    ) -> Move:
        execution, steps = snapshot
        assert execution is not None
        record = next((s for s in steps if s.name == node.name), None)
        if record is not None and record.status is not StepStatus.RUNNING:
            return Refuse(message, Admission.REJECT_ALREADY_DONE)
        child_id = child_execution_id(execution.id, node.name)
        child = queries.load_execution(self.parts.db, child_id)
        step = decide_child_step(child)
        if step is ChildStep.START or record is None:
            return self._start(definition, (execution, steps), message, node, record, child_id)
        if step is ChildStep.WAIT:
            return Stay()  # the child notifies its parent when it settles
        assert child is not None
        if step is ChildStep.COMPLETE:
            return self._complete(definition, message, node, record, child)
        reason = child_failure(node.saga, child)
        return FailStep(definition, _held(message, record), reason)

    def _start(
        self,
        definition: SagaDefinition,
        snapshot: tuple[ExecutionRecord, list[StepRecord]],
        message: NodeMessage,
        node: SubSagaNode,
        record: StepRecord | None,
        child_id: str,
    ) -> Move:
        ex = self.parts
        execution = snapshot[0]
        child_definition = ex.registry(node.saga)
        if child_definition is None:
            raise UnknownSagaError(
                f"saga {node.saga!r}, a sub-saga of {definition.name!r}, is not registered on "
                "this worker; import its definitions module in every worker"
            )
        try:
            child_input = self._child_input(definition, snapshot, node, message.node)
        except (SubSagaError, PayloadError) as error:
            return FailRun(definition, execution.id, describe_error(error), (message.node, 0))
        key = record_key(execution.id, node.name, "forward")
        if (
            record is None
            and forward.claim_step(
                ex.db,
                execution_id=execution.id,
                name=node.name,
                node=message.node,
                sub=0,
                definition_hash=definition.hash,
                idempotency_key=key,
                compensatable=True,
                lease_expires_at=None,
                now=get_clock().now(),
                existing=None,
                child_execution_id=child_id,
            )
            is None
        ):
            return Refuse(message, Admission.REJECT_IN_FLIGHT)
        if record is None:  # the node's record claimed now: its start, once per run
            started: dict[str, Any] = {
                "execution_id": execution.id,
                "saga": definition.name,
                "step": node.name,
                "attempt": 1,
                "idempotency_key": key,
                "sub_saga": True,
                "version": definition.hash,
            }
            ex.emit("saga-step-started", started)
        return StartChild(child_definition, child_input, child_id, execution.id)

    def _child_input(
        self,
        definition: SagaDefinition,
        snapshot: tuple[ExecutionRecord, list[StepRecord]],
        node: SubSagaNode,
        index: int,
    ) -> dict[str, Any]:
        """Journaled ``child:<node>``: the child's input, fixed before the child starts."""
        db = self.parts.db
        what = f"saga {definition.name!r}: the input of sub_saga {node.name!r}"

        def compute() -> dict[str, Any]:
            value: Any = snapshot[0].input
            if node.input is not None:
                value = ask(
                    db,
                    definition,
                    snapshot,
                    node.input,
                    name=node.name,
                    what=what,
                    error=SubSagaError,
                )
            mapping = as_plain_mapping(value)
            if not isinstance(value, Mapping) and not mapping:
                raise SubSagaError(f"{what} must be a mapping (dict), got {type(value).__name__}")
            return dict(mapping)

        return dict(journaled(db, snapshot[0].id, f"child:{index}", compute, what))

    def _complete(
        self,
        definition: SagaDefinition,
        message: NodeMessage,
        node: SubSagaNode,
        record: StepRecord,
        child: ExecutionRecord,
    ) -> Move:
        ex = self.parts
        _, child_steps = queries.load_snapshot(ex.db, child.id)
        blob = pack(
            completed_results(child_steps),
            what=f"results of sub-saga {node.name!r} of saga {definition.name!r}",
            limit=ex.settings.max_payload_bytes,
        )
        fields = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "step": node.name,
            "attempt": record.attempts,
            "idempotency_key": record.idempotency_key,
        }
        onward = next_position(definition, message.node, 0)
        return CompleteStep(definition, _held(message, record), blob, onward, fields)


def _held(message: NodeMessage, record: StepRecord) -> Attempt:
    """The parent's claim on its sub-saga node, as the node's message names it."""
    return Attempt(
        message.execution_id,
        record.name,
        message.node,
        message.sub,
        record.attempts,
        record.started_at,
    )
