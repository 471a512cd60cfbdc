"""Paused steps in the runtime: a run whose step claim a pause refused is held at the
step's door (no body started, no worker slot kept), and ``unpause`` releases it forward as
a held run's ``retry`` does (``PublishPosition`` of its step). The writes are
``store/pauses.py``'s."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.builder import SagaDefinition
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import Announce, Move, PublishPosition, then
from celery_saga.runtime.parts import Parts
from celery_saga.store import pauses

logger = logging.getLogger("celery_saga")


@dataclass(frozen=True)
class Pauses:
    """Holds a run at a paused step's door, and releases it."""

    parts: Parts

    def hold_at_door(
        self, definition: SagaDefinition, step: str, record: str, message: NodeMessage
    ) -> Move | None:
        """Hold the run of ``message`` at ``step``'s door (its record there: ``record``) if a
        pause covers the step; None: none does (any more), the run is no longer live there,
        or a live claim of the step runs its body (nothing written)."""
        now = get_clock().now()
        held = pauses.hold_at_door(
            self.parts.db,
            message.execution_id,
            saga=definition.name,
            step=step,
            node=message.node,
            sub=message.sub,
            now=now,
            record=record,
        )
        if held is None:
            return None
        logger.info(
            "saga %r execution %s: held at the door of step %r, which is paused (%s): no "
            "body started; unpause releases it",
            definition.name,
            message.execution_id,
            step,
            held.reason,
        )
        fields = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "step": step,
            "reason": held.held_reason,
        }
        return Announce("saga-held", fields)

    def release(
        self,
        definition: SagaDefinition,
        execution_id: str,
        actor: str | None,
        reason: str | None,
    ) -> tuple[Move, bool] | None:
        """Release a run held at a paused step's door (its step's message published again)
        and whether this call released it (False: a retry of a release whose reply was
        lost: its message is sent all the same); None: released already, or moved
        meanwhile (nothing to send)."""
        db, now = self.parts.db, get_clock().now()
        released = pauses.release(db, execution_id, now=now, actor=actor, reason=reason)
        if released is None:
            return None
        run, fresh = released
        logger.info(
            "saga %r execution %s: released from a paused step's door by %s",
            definition.name,
            execution_id,
            actor or "an operator",
        )
        fields = {"execution_id": execution_id, "saga": definition.name, "actor": actor}
        move = then(
            Announce("saga-unpaused", fields),
            PublishPosition(definition, execution_id, run.cursor, run.cursor_sub),
        )
        return move, fresh
