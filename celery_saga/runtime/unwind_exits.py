"""The operator's exits from a parked unwind: resume it, or abandon it for good."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_saga.definition.builder import SagaDefinition
from celery_saga.runtime.clock import get_clock
from celery_saga.store import unwind

if TYPE_CHECKING:
    from celery_saga.runtime.unwinder import Unwinder


def resume(unwinder: Unwinder, definition: SagaDefinition, execution_id: str) -> None:
    """Reopen a parked unwind (and first the parked children it halted on). The
    reversal that failed, or whose outcome could not be recorded, runs again under its
    own idempotency key; the log line names it."""
    unwind.require_stuck(unwinder.db, execution_id, "resume_compensation")
    unwinder.name_reruns(execution_id)
    unwinder.children.resume_children(execution_id)
    unwind.resume_compensation(unwinder.db, execution_id, get_clock().now())
    unwinder.emit(
        "saga-compensation-resumed", {"execution_id": execution_id, "saga": definition.name}
    )
    unwinder.follow(
        definition,
        execution_id,
        unwind.plan_unwind(
            unwinder.db,
            execution_id=execution_id,
            compensations=definition.reversible,
            now=get_clock().now(),
        ),
    )


def abandon(unwinder: Unwinder, definition: SagaDefinition, execution_id: str) -> int:
    """Close a parked unwind for good (and the parked children it halted on)."""
    unwind.require_stuck(unwinder.db, execution_id, "abandon_compensation")
    unwinder.children.abandon_children(execution_id)
    skipped = unwind.abandon_compensation(unwinder.db, execution_id, get_clock().now())
    unwinder.emit(
        "saga-failed",
        {
            "execution_id": execution_id,
            "saga": definition.name,
            "rollback_status": "stuck",
            "abandoned": True,
        },
    )
    unwinder.settled(definition, execution_id)
    return skipped
