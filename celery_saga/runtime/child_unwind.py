"""A parent's unwind through its children, and children telling their parent they settled
(guarantees 17, 18). A child's unwind is its own, run by its own messages; the
parent's record of it is settled once the child reports back."""

from __future__ import annotations

import logging

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.children import (
    ChildReversalKind,
    Notify,
    decide_child_reversal,
    decide_notification,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import (
    FollowUnwind,
    Move,
    PublishNode,
    RecordReversal,
    Stay,
    next_reversal,
)
from celery_saga.runtime.parts import Parts
from celery_saga.store import queries, unwind

logger = logging.getLogger("celery_saga")


class ChildUnwind:
    """A parent's unwind through its children; returns the move for its owner."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def reverse(
        self, definition: SagaDefinition, parent: ExecutionRecord, record: StepRecord
    ) -> Move:
        """The parent's unwind reached its record of a child."""
        u = self.parts
        assert record.child_execution_id is not None
        child = queries.load_execution(u.db, record.child_execution_id)
        decision = decide_child_reversal(child, record.child_execution_id)
        fields = {"execution_id": parent.id, "saga": definition.name, "step": record.name}
        if decision.kind is ChildReversalKind.START_UNWIND:
            assert child is not None
            child_definition = u.definition_of(child)
            plan = unwind.reopen_for_unwind(
                u.db,
                execution_id=child.id,
                reason=(
                    f"its parent saga {definition.name!r} ({parent.id}) is unwinding: "
                    f"{parent.failure_reason}"
                ),
                compensations=child_definition.reversible,
                now=get_clock().now(),
            )
            if plan is None:
                return Stay()
            u.emit("saga-compensation-started", {**fields, "child_execution_id": child.id})
            return FollowUnwind(child_definition, child.id, plan)
        if decision.kind is ChildReversalKind.WAIT:
            return Stay()  # the child reports back when its unwind settles
        settled = decision.kind is ChildReversalKind.SETTLED
        outcome = CompensationOutcome.COMPENSATED if settled else CompensationOutcome.FAILED
        return RecordReversal(definition, parent.id, record, outcome, decision.reason)

    def notify_parent(self, child_id: str) -> Move:
        """The child settled: what its parent waits on is published (no parent polls a
        child)."""
        u = self.parts
        child = queries.load_execution(u.db, child_id)
        if child is None or child.parent_execution_id is None:
            return Stay()
        parent, steps = queries.load_snapshot(u.db, child.parent_execution_id)
        record = next((s for s in steps if s.child_execution_id == child_id), None)
        notify = decide_notification(parent, record)
        if notify is Notify.NOTHING or parent is None or record is None:
            return Stay()
        definition = u.registry.known(parent.saga_name, parent.definition_hash)
        if definition is None:  # handed on, for a worker that has the parent's version
            self._hand_on(parent, record, notify)
            return Stay()
        if notify is Notify.NODE:
            message = NodeMessage(parent.id, record.node, record.sub, 0, 1)
            return PublishNode(definition, message, f"{definition.name}.{record.name}")
        return next_reversal(definition, parent.id, record)

    def _hand_on(self, parent: ExecutionRecord, record: StepRecord, notify: Notify) -> None:
        """The parent's message, named after its version (a worker without it hands it back)."""
        publisher, version = self.parts.publisher, parent.definition_hash
        if notify is Notify.NODE:
            message = NodeMessage(parent.id, record.node, record.sub, 0, 1)
            label = f"{parent.saga_name}.{record.name}"
            publisher.publish_node(parent.saga_name, None, message, label=label, version=version)
            return
        attempt = record.compensation_attempts + 1
        publisher.publish_compensation(
            parent.saga_name, None, parent.id, record.name, attempt, version=version
        )

    def parked_children(
        self, parent_id: str, outcomes: tuple[CompensationOutcome | None, ...]
    ) -> list[ExecutionRecord]:
        """The parked children of ``parent_id`` whose reversal stands at one of
        ``outcomes``: a resume of the parent resumes those it halted on (``FAILED``) first;
        an abandon abandons those still owed too (``None``), so none is left parked under a
        parent that has ended."""
        _, steps = queries.load_snapshot(self.parts.db, parent_id)
        parked = []
        for record in steps:
            if record.child_execution_id is None or record.compensation_status not in outcomes:
                continue
            child = queries.load_execution(self.parts.db, record.child_execution_id)
            if child is not None and child.state is ExecutionState.COMPENSATION_STUCK:
                parked.append(child)
        return parked
