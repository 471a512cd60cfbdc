"""Held runs in the runtime: a ``hold`` step's final failure holds its run, and the moves
that release it (retry, skip, unwind, the hold timeout). Each reads and writes what its
decision needs (``store/holds.py``) and returns the move ``Interpreter.carry_out`` makes.

Releasing a held run forward (``PublishPosition`` of its step, ``MoveOn`` past it) is the
same whatever held it, so a run held for another reason (a paused step) is released here
too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import InvalidStateError
from celery_saga.records import Attempt, StepStatus
from celery_saga.runtime import navigation
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.invoke import apply_schema, storable
from celery_saga.runtime.moves import (
    Announce,
    BeginUnwind,
    Move,
    MoveOn,
    PublishPosition,
    Stay,
    then,
)
from celery_saga.runtime.parts import Parts
from celery_saga.store import holds, queries
from celery_saga.store.codec import pack

logger = logging.getLogger("celery_saga")

#: The actor the hold timeout's unwind is recorded with.
HOLD_TIMEOUT_ACTOR = "hold timeout"


@dataclass(frozen=True)
class Holds:
    """Holds a run and carries out the moves on a held one."""

    parts: Parts

    def hold(
        self, definition: SagaDefinition, step: Attempt, reason: str, error: BaseException | None
    ) -> Move | None:
        """Hold the run of ``step`` (a final failure) if its policy says so; None: it does
        not hold, the failure is recorded as usual. ``Stay`` also when the run is no
        longer live at the step (a cancel came first: its unwind records the step)."""
        spec = definition.find_step(step.name)
        if spec is None:
            return None
        policy = definition.failure_policy(spec, step.node)
        if not policy.hold:
            return None
        parts, now = self.parts, get_clock().now()
        timeout = policy.hold_timeout
        until = None if timeout is None else now + timedelta(seconds=timeout)

        def landed() -> bool:
            record = queries.load_step(parts.db, step.execution_id, step.name)
            return (
                record is not None
                and record.status is StepStatus.FAILED
                and record.attempts == step.attempt
            )

        held = parts.write_step_outcome(
            definition,
            step,
            lambda: holds.hold_step(parts.db, step, error=reason, hold_until=until, now=now),
            what=f"the hold of step {step.name!r} of execution {step.execution_id}",
            landed=landed,
            if_landed=True,
            cause=error,
        )
        if not held:
            return Stay()
        logger.warning(
            "saga %r execution %s: step %r failed for good after %d attempt(s) and the run "
            "is held for an operator (retry, skip, unwind or cancel)%s: %s",
            definition.name,
            step.execution_id,
            step.name,
            step.attempt,
            "" if timeout is None else f"; it unwinds after {timeout:g}s",
            reason,
        )
        fields = {
            "execution_id": step.execution_id,
            "saga": definition.name,
            "step": step.name,
            "attempts": step.attempt,
            "error": reason,
            "hold_timeout": timeout,
        }
        return Announce("saga-held", fields)

    def retry(
        self, definition: SagaDefinition, execution_id: str, actor: str | None, reason: str | None
    ) -> Move:
        """Run the held step again with a fresh attempt budget, same key (guarantee 9)."""
        now = get_clock().now()
        held = holds.retry_held(self.parts.db, execution_id, now=now, actor=actor, reason=reason)
        run = held.execution
        self._log("retried", definition, execution_id, held.step.name, actor)
        fields = self._fields(definition, execution_id, held.step.name, actor)
        announce = Announce("saga-hold-retried", fields)
        return then(announce, PublishPosition(definition, execution_id, run.cursor, run.cursor_sub))

    def skip(
        self,
        definition: SagaDefinition,
        execution_id: str,
        result: Any,
        actor: str | None,
        reason: str | None,
    ) -> Move:
        """Record the held step completed by hand with ``result`` (checked against its
        ``output_schema``), and move the run on."""
        db = self.parts.db
        expected = holds.read_held(db, execution_id, "skip")
        run, step = expected.execution, expected.step
        message = NodeMessage(execution_id, run.cursor, run.cursor_sub, 0, 0)
        position = navigation.resolve(db, definition, None, message)
        spec = position.spec
        if spec is None:
            raise InvalidStateError(f"execution {execution_id!r}: no step is held at its cursor")
        checked = check_result(definition.name, spec.name, spec.output_schema, result)
        blob = pack(
            checked,
            what=f"result given to skip step {step.name!r} of execution {execution_id!r}",
            limit=self.parts.settings.max_payload_bytes,
        )
        onward = navigation.next_position(definition, run.cursor, run.cursor_sub, position.length)
        holds.skip_held(
            db,
            execution_id,
            result_blob=blob,
            onward=onward,
            expected=expected,
            now=get_clock().now(),
            actor=actor,
            reason=reason,
        )
        self._log("skipped", definition, execution_id, step.name, actor)
        fields = self._fields(definition, execution_id, step.name, actor)
        return then(Announce("saga-hold-skipped", fields), MoveOn(definition, execution_id, onward))

    def unwind(
        self,
        definition: SagaDefinition,
        execution_id: str,
        actor: str | None,
        reason: str | None,
        *,
        due: bool = False,
    ) -> Move:
        """Begin the held run's unwind, as its step's failure would have under
        ``on_failure="unwind"``; ``due``: the hold timeout's (only a hold past it)."""
        now = get_clock().now()
        held, plan = holds.unwind_held(
            self.parts.db,
            execution_id,
            compensations=definition.reversible,
            now=now,
            actor=actor,
            reason=reason,
            due_by=now if due else None,
        )
        self._log("unwound", definition, execution_id, held.step.name, actor)
        fields = self._fields(definition, execution_id, held.step.name, actor)
        failure = held.execution.failure_reason
        return then(
            Announce("saga-hold-unwound", fields),
            BeginUnwind(definition, execution_id, plan, failure),
        )

    def expired(self, page: int) -> list[str]:
        """Held runs whose hold timeout has passed (the timer sweep unwinds them)."""
        return holds.list_expired_holds(self.parts.db, now=get_clock().now(), limit=page)

    def _log(
        self,
        did: str,
        definition: SagaDefinition,
        execution_id: str,
        step: str,
        actor: str | None,
    ) -> None:
        logger.warning(
            "saga %r execution %s: held step %r %s by %s",
            definition.name,
            execution_id,
            step,
            did,
            actor or "an operator",
        )

    @staticmethod
    def _fields(
        definition: SagaDefinition, execution_id: str, step: str, actor: str | None
    ) -> dict[str, Any]:
        return {"execution_id": execution_id, "saga": definition.name, "step": step, "actor": actor}


def check_result(saga: str, step: str, schema: Any, result: Any) -> Any:
    """A result given by hand, checked as the step's own would be (its ``output_schema``;
    ``SchemaValidationError`` names the field), as it would be stored."""
    what = f"the result given to skip step {step!r} of saga {saga!r}"
    return storable(apply_schema(schema, result, what))
