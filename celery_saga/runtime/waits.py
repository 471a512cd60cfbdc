"""``wait_for`` gates and signals (guarantees 13-16): parking, resuming once, and the
deadline sweep. Deadlines are rows (``wake_at``), never timers in a process."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery_saga.decisions.admission import Admission, NodeMessage
from celery_saga.decisions.waits import Arrival, Wake
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import WaitNode
from celery_saga.errors import UnknownEventError
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import BeginUnwind, Move, MoveOn, Refuse, Stay
from celery_saga.runtime.navigation import next_position
from celery_saga.runtime.parts import Parts
from celery_saga.store import waits
from celery_saga.store.codec import pack

logger = logging.getLogger("celery_saga")


def _seconds(value: float) -> str:
    return f"{value:g} s" if value < 120 else str(timedelta(seconds=round(value)))


class Waits:
    """Parks runs at their gates and resumes them; returns the move for its owner."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def arrive(self, definition: SagaDefinition, message: NodeMessage, gate: WaitNode) -> Move:
        """The run reached ``gate``: park it, or pass at once if the signal is there."""
        ex, now = self.parts, get_clock().now()
        wake_at = None if gate.timeout is None else now + timedelta(seconds=gate.timeout)
        onward = next_position(definition, message.node, 0)
        arrival = waits.park_for_signal(
            ex.db,
            execution_id=message.execution_id,
            gate=message.node,
            event=gate.event,
            definition_hash=definition.hash,
            wake_at=wake_at,
            advance=onward,
            now=now,
        )
        fields: dict[str, Any] = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "event": gate.event,
        }
        if arrival is Arrival.PARK:
            ex.emit("saga-waiting", {**fields, "wake_at": wake_at.isoformat() if wake_at else None})
            return Stay()
        if arrival is Arrival.PASS:  # its signal came first
            ex.emit("saga-resumed", {**fields, "on_arrival": True, "version": definition.hash})
            return MoveOn(definition, message.execution_id, onward)
        return Refuse(message, Admission.REJECT_STALE_CURSOR)

    def signal(
        self,
        definition: SagaDefinition,
        execution_id: str,
        event: str,
        payload: Any,
        actor: str | None = None,
    ) -> Move:
        """Record the signal once; a ``MoveOn`` if it resumed the run parked at its gate."""
        ex = self.parts
        gate = definition.wait_position(event)
        if gate is None:
            known = ", ".join(repr(e) for e in definition.events) or "none"
            raise UnknownEventError(
                f"signal {event!r} for execution {execution_id!r} refused: saga "
                f"{definition.name!r} has no wait_for({event!r}) (its events: {known})"
            )
        blob = pack(
            payload,
            what=f"payload of signal {event!r} for execution {execution_id!r}",
            limit=ex.settings.max_payload_bytes,
        )
        onward = next_position(definition, gate, 0)
        resumed = waits.record_signal_once(
            ex.db,
            execution_id=execution_id,
            event=event,
            payload_blob=blob,
            gate=gate,
            advance=onward,
            now=get_clock().now(),
            actor=actor,
        )
        fields = {"execution_id": execution_id, "saga": definition.name, "event": event}
        ex.emit("saga-signal-received", {**fields, "resumed": resumed})
        if not resumed:
            return Stay()
        ex.emit("saga-resumed", fields)
        return MoveOn(definition, execution_id, onward)

    def expire(self, row: waits.ExpiredWait, now: datetime) -> Move:
        """Fire one deadline that passed: fail the run (re-checking its signal first), or
        resume it if the signal won the race."""
        ex = self.parts
        definition = ex.registry.known(row.saga_name, row.definition_hash)
        gate = definition.nodes[row.cursor] if definition is not None else None
        if definition is None or not isinstance(gate, WaitNode):
            logger.warning(
                "execution %s waits past its deadline, but version %s of saga %r is not "
                "registered here; left for the timer sweep of a worker that has it",
                row.id,
                row.definition_hash,
                row.saga_name,
            )
            return Stay()
        waited = _seconds(gate.timeout or 0)
        reason = (
            f"WaitTimeoutError: saga {definition.name!r} waited {waited} for the signal "
            f"{gate.event!r}, which did not arrive"
        )
        onward = next_position(definition, row.cursor, 0)
        result = waits.expire_wait(
            ex.db,
            execution_id=row.id,
            event=gate.event,
            reason=reason,
            advance=onward,
            compensations=definition.reversible,
            now=now,
        )
        fields = {"execution_id": row.id, "saga": definition.name, "event": gate.event}
        if result.wake is not Wake.NOTHING:
            entered = row.wake_at - timedelta(seconds=gate.timeout or 0)
            run = (definition.name, definition.hash, row.id)
            ending = "timeout" if result.wake is Wake.TIME_OUT else "signal"
            ex.tracer.waited(*run, gate.event, entered, row.trace_context, ending)
        if result.wake is Wake.TIME_OUT:
            assert result.unwind is not None
            ex.emit("saga-wait-expired", fields)
            return BeginUnwind(definition, row.id, result.unwind, reason)
        if result.wake is Wake.RESUME:
            ex.emit("saga-resumed", fields)
            return MoveOn(definition, row.id, onward)
        return Stay()
