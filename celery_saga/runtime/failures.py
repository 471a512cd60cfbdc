"""What the forward executor does when a step attempt fails, or a run must fail outside
any step: retry with a countdown, or record the failure and begin the unwind."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.retry import backoff_delay
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode
from celery_saga.errors import PayloadError, SchemaValidationError
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.navigation import Position
from celery_saga.runtime.ports import RuntimeParts
from celery_saga.runtime.store_retry import keep_cause
from celery_saga.runtime.unwinder import Unwinder, compensations_of
from celery_saga.store import forward

logger = logging.getLogger("celery_saga")


class StepFailures(RuntimeParts):
    unwinder: Unwinder

    def _step_failed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        attempt: int,
        error: Exception,
    ) -> None:
        spec, name = position.spec, position.record_name
        assert spec is not None
        reason = describe_error(error)
        fields = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "step": name,
            "attempt": attempt,
            "idempotency_key": record_key(message.execution_id, name, "forward"),
            "error": reason,
        }
        # The same value would be refused again: no point retrying.
        deterministic = isinstance(error, (PayloadError, SchemaValidationError))
        final = attempt >= spec.retry or deterministic
        logger.log(
            logging.ERROR if final else logging.WARNING,
            "saga %r execution %s: step %r attempt %d failed: %s",
            definition.name,
            message.execution_id,
            name,
            attempt,
            reason,
            exc_info=error,
        )
        if not final:
            self._schedule_retry(definition, position, message, attempt, reason, fields)
            return
        target = definition.nodes[message.node]
        members = [s.name for s in target.steps] if isinstance(target, ParallelNode) else [name]
        self.settle_failure(definition, message, name, attempt, members, reason, error)
        self.emit("saga-step-failed", fields)

    def settle_failure(
        self,
        definition: SagaDefinition,
        message: NodeMessage,
        name: str,
        attempt: int,
        members: list[str],
        reason: str,
        error: Exception | None,
    ) -> None:
        """Record the step ``name`` failed for good; the last member to settle fails the run
        and begins its unwind. A store that keeps refusing re-raises ``error``."""
        group = keep_cause(
            self.settings.store_retry_delays,
            error,
            lambda: forward.record_step_settled(
                self.db,
                execution_id=message.execution_id,
                name=name,
                attempt=attempt,
                node=message.node,
                sub=message.sub,
                members=members,
                compensations=compensations_of(definition),
                now=get_clock().now(),
                advance=Advance(message.node, message.sub, False, False),
                error=reason,
            ),
        )
        if group is not None and group.settled and group.unwind is not None:
            self.unwinder.begin(
                definition, message.execution_id, group.unwind, group.failure_reason
            )

    def _schedule_retry(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        attempt: int,
        reason: str,
        fields: dict[str, Any],
    ) -> None:
        """Release the claim and publish the next attempt with a countdown (no slot held)."""
        spec = position.spec
        assert spec is not None
        if forward.record_step_retry(
            self.db,
            execution_id=message.execution_id,
            name=position.record_name,
            attempt=attempt,
            error=reason,
        ):
            delay = backoff_delay(attempt, spec.backoff, spec.backoff_max, get_clock().random())
            self.emit("saga-step-retry", {**fields, "countdown": delay})
            self.publisher.publish_node(
                definition.name, spec, replace(message, attempt=attempt + 1), countdown=delay
            )

    def fail_outside_step(self, definition: SagaDefinition, execution_id: str, reason: str) -> None:
        """Fail a live run for a reason no step raised (a choice that could not be made, a
        changed definition) and begin its unwind."""
        plan = forward.fail_execution(
            self.db,
            execution_id=execution_id,
            reason=reason,
            compensations=compensations_of(definition),
            now=get_clock().now(),
        )
        if plan is None:
            logger.info(
                "execution %s not failed now (%s): not live, or a step is in flight",
                execution_id,
                reason,
            )
        else:
            self.unwinder.begin(definition, execution_id, plan, reason)
