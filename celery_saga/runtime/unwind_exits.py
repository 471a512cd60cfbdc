"""The operator's exits from a parked unwind: reopen it, go on past a reversal done by
hand, or close it for good. The owner (``Unwinder.resume`` / ``resolve`` / ``abandon``)
first checks the run is parked and handles the parked children it halted on, then has the
interpreter carry out what these return."""

from __future__ import annotations

import logging

from celery_saga.definition.builder import SagaDefinition
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import FollowUnwind, Settled
from celery_saga.runtime.parts import Parts
from celery_saga.store import operator_exits, unwind

logger = logging.getLogger("celery_saga")


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


def go_on_by_hand(
    parts: Parts,
    definition: SagaDefinition,
    execution_id: str,
    resolved: tuple[str, str],
    actor: str | None = None,
) -> FollowUnwind:
    """Record the parked reversal of ``resolved[0]`` as done by hand (note
    ``resolved[1]``) and go on with the next reversal of the ordered unwind."""
    step, note = resolved
    now = get_clock().now()
    stored = operator_exits.resolve_compensation(
        parts.db, execution_id, step=step, note=note, now=now, actor=actor
    )
    logger.warning(
        "execution %s of saga %r: the reversal of step %r %s as done by hand by %s "
        "(note: %s); the unwind goes on",
        execution_id,
        definition.name,
        step,
        "recorded" if stored else "was already recorded",
        actor or "an operator",
        note,
    )
    if stored:
        fields = {"execution_id": execution_id, "saga": definition.name, "step": step}
        parts.emit("saga-compensation-resolved", fields)
    # Also after a retry: the next reversal's message may be what the lost reply cost
    # (a second one is dropped by admission, guarantee 10).
    plan = unwind.plan_unwind(
        parts.db, execution_id=execution_id, compensations=definition.reversible, now=now
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
