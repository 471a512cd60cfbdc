"""Carrying an unwind on from the move its last record decided: the next reversal's
message, the end's notice, or the park's (guarantees 1-9). Each returns the move that
follows for ``Interpreter.carry_out``."""

from __future__ import annotations

import logging
from typing import Any

from celery_saga.decisions.unwind import UnwindKind, UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import Move, Settled, Stay, next_reversal
from celery_saga.runtime.parts import Parts
from celery_saga.store import unwind

logger = logging.getLogger("celery_saga")


def begin(
    parts: Parts,
    definition: SagaDefinition,
    execution_id: str,
    plan: UnwindStep,
    failure_reason: str | None,
    at: tuple[int, int] | None = None,
) -> Move:
    """The first move of an unwind that the failure record just decided; ``at``: the
    (node, sub) of a failure that no step raised."""
    fields: dict[str, Any] = {
        "execution_id": execution_id,
        "saga": definition.name,
        "reason": failure_reason,
    }
    if at is not None:
        fields.update(node=at[0], sub=at[1], version=definition.hash)
    parts.emit("saga-forward-failed", fields)
    return follow(parts, definition, execution_id, plan)


def follow(
    parts: Parts, definition: SagaDefinition, execution_id: str, plan: UnwindStep | None
) -> Move:
    """The unwind's next move: publish the reversal it names, or announce its end or its
    park (then the run has settled)."""
    fields = {"execution_id": execution_id, "saga": definition.name}
    if plan is None:
        return Stay()
    if plan.kind is UnwindKind.COMPENSATE:
        assert plan.record is not None
        return next_reversal(definition, execution_id, plan.record)
    if plan.kind is UnwindKind.DONE:
        assert plan.rollback_status is not None
        parts.emit("saga-failed", {**fields, "rollback_status": plan.rollback_status.value})
        return Settled(definition, execution_id)
    if plan.kind is UnwindKind.HALT_VANISHED:
        # The plan was made before parking; parking is what records it.
        plan = unwind.plan_unwind(
            parts.db,
            execution_id=execution_id,
            compensations=definition.reversible,
            now=get_clock().now(),
        )
    assert plan is None or plan.record is not None
    step = plan.record.name if plan and plan.record else None
    logger.warning(
        "execution %s of saga %r parked compensation_stuck at the reversal of step %r "
        "(%s): %s (to continue: celery saga resume %s, or abandon)",
        execution_id,
        definition.name,
        step,
        plan.kind.value if plan else "halted",
        plan.record.compensation_reason if plan and plan.record else "",
        execution_id,
    )
    parts.emit("saga-compensation-stuck", {**fields, "step": step})
    return Settled(definition, execution_id)
