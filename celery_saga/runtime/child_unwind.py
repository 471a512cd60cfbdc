"""A parent's unwind through its children, and children telling their parent they settled
(guarantees 17, 18). A child's rollback is its own unwind, run by its own messages; the
parent's record of it is settled once the child reports back."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.children import (
    ChildReversalKind,
    Notify,
    decide_child_reversal,
    decide_notification,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import UnknownSagaError
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.store import queries, unwind

if TYPE_CHECKING:
    from celery_saga.runtime.unwinder import Unwinder

logger = logging.getLogger("celery_saga")


class ChildUnwind:
    def __init__(self, unwinder: Unwinder) -> None:
        self.unwinder = unwinder

    def _definition(self, execution: ExecutionRecord) -> SagaDefinition:
        definition = self.unwinder.registry(execution.saga_name)
        if definition is None:
            raise UnknownSagaError(
                f"saga {execution.saga_name!r} of execution {execution.id!r} is not registered "
                "on this worker; import its definitions module in every worker"
            )
        return definition

    def reverse(
        self, definition: SagaDefinition, parent: ExecutionRecord, record: StepRecord
    ) -> None:
        """The parent's unwind reached its record of a child."""
        u = self.unwinder
        assert record.child_execution_id is not None
        child = queries.load_execution(u.db, record.child_execution_id)
        decision = decide_child_reversal(child, record.child_execution_id)
        fields = {"execution_id": parent.id, "saga": definition.name, "step": record.name}
        if decision.kind is ChildReversalKind.START_UNWIND:
            assert child is not None
            child_definition = self._definition(child)
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
            if plan is not None:
                u.emit("saga-compensation-started", {**fields, "child_execution_id": child.id})
                u.follow(child_definition, child.id, plan)
            return
        if decision.kind is ChildReversalKind.WAIT:
            return  # the child reports back when its unwind settles
        settled = decision.kind is ChildReversalKind.SETTLED
        outcome = CompensationOutcome.COMPENSATED if settled else CompensationOutcome.FAILED
        plan = u.record_outcome(
            definition,
            parent.id,
            record.name,
            record.compensation_attempts,
            outcome,
            decision.reason,
        )
        if plan is None:
            return
        if settled:
            u.emit("saga-step-compensated", fields)
        else:
            u.emit("saga-compensation-failed", {**fields, "error": decision.reason})
        u.follow(definition, parent.id, plan)

    def notify_parent(self, child_id: str) -> None:
        """The child settled: publish what its parent waits on (no parent polls a child)."""
        u = self.unwinder
        child = queries.load_execution(u.db, child_id)
        if child is None or child.parent_execution_id is None:
            return
        parent, steps = queries.load_snapshot(u.db, child.parent_execution_id)
        record = next((s for s in steps if s.child_execution_id == child_id), None)
        notify = decide_notification(parent, record)
        if notify is Notify.NOTHING or parent is None or record is None:
            return
        definition = u.registry(parent.saga_name)
        if definition is None:
            logger.warning(
                "child %s settled but its parent's saga %r is not registered here; the "
                "recovery sweep will pick the parent up",
                child_id,
                parent.saga_name,
            )
            return
        if notify is Notify.NODE:
            message = NodeMessage(parent.id, record.node, record.sub, 0, 1)
            label = f"{definition.name}.{record.name}"
            u.publisher.publish_node(definition.name, None, message, label=label)
        else:
            u.publish_reversal(definition, parent.id, record)

    def _parked_children(
        self, parent_id: str, outcomes: tuple[CompensationOutcome | None, ...]
    ) -> list[ExecutionRecord]:
        _, steps = queries.load_snapshot(self.unwinder.db, parent_id)
        parked = []
        for record in steps:
            if record.child_execution_id is None or record.compensation_status not in outcomes:
                continue
            child = queries.load_execution(self.unwinder.db, record.child_execution_id)
            if child is not None and child.state is ExecutionState.COMPENSATION_STUCK:
                parked.append(child)
        return parked

    def resume_children(self, parent_id: str) -> None:
        """Before a parent's unwind is resumed: resume the parked children it halted on."""
        for child in self._parked_children(parent_id, (CompensationOutcome.FAILED,)):
            self.unwinder.resume(self._definition(child), child.id)

    def abandon_children(self, parent_id: str) -> None:
        """Before a parent's unwind is abandoned: abandon its parked children too, so none
        is left parked under a parent that has ended."""
        owed = (None, CompensationOutcome.FAILED)
        for child in self._parked_children(parent_id, owed):
            self.unwinder.abandon(self._definition(child), child.id)
