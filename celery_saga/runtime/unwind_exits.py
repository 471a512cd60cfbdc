"""The operator's exits from a parked unwind: reopen it, or close it for good. The owner
(``Unwinder.resume`` / ``abandon``) first checks the run is parked and handles the parked
children it halted on, then has the interpreter carry out what these return."""

from __future__ import annotations

from celery_saga.definition.builder import SagaDefinition
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import FollowUnwind, Settled
from celery_saga.runtime.parts import Parts
from celery_saga.store import operator_exits, unwind


def reopen(
    parts: Parts, definition: SagaDefinition, execution_id: str, actor: str | None = None
) -> FollowUnwind:
    """Reopen a parked unwind; the reversal that failed, or whose outcome could not be
    recorded, runs again under its own idempotency key (``actor``: who asked)."""
    operator_exits.resume_compensation(parts.db, execution_id, get_clock().now(), actor)
    parts.emit("saga-compensation-resumed", {"execution_id": execution_id, "saga": definition.name})
    plan = unwind.plan_unwind(
        parts.db,
        execution_id=execution_id,
        compensations=definition.reversible,
        now=get_clock().now(),
    )
    return FollowUnwind(definition, execution_id, plan)


def close(
    parts: Parts,
    definition: SagaDefinition,
    execution_id: str,
    actor: str | None = None,
    reason: str | None = None,
) -> tuple[int, Settled]:
    """Close a parked unwind for good; returns how many steps were marked skipped, and
    the run's settling (its parent is told)."""
    now = get_clock().now()
    skipped = operator_exits.abandon_compensation(
        parts.db, execution_id, now=now, actor=actor, reason=reason
    )
    parts.emit(
        "saga-failed",
        {
            "execution_id": execution_id,
            "saga": definition.name,
            "rollback_status": "stuck",
            "abandoned": True,
        },
    )
    return skipped, Settled(definition, execution_id)
