"""Running one claimed reversal: its handler under the claim's lease, then its outcome
(guarantees 1-7, 20, 27, 30)."""

from __future__ import annotations

import logging
from dataclasses import replace

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.lost_claims import MINE
from celery_saga.decisions.retry import backoff_delay
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import PayloadKeyError
from celery_saga.records import CompensationOutcome, ReversalAttempt, StepRecord
from celery_saga.redaction import scrub
from celery_saga.runtime.async_bodies import run_body
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.contexts import reversal_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.holders import attempt_running
from celery_saga.runtime.invoke import body_error, body_of, call_arguments
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.outcomes import (
    Failed,
    Outcome,
    Ran,
    Retrying,
    TakenOver,
    attempt_failed,
    no_body_if_taken_over,
)
from celery_saga.runtime.reversal_outcome import ReversalOutcomes
from celery_saga.runtime.scrubbing import failure_secrets, log_failure, scrub_exception
from celery_saga.runtime.stopping import worker_is_stopping
from celery_saga.store import unwind
from celery_saga.store.reversal import Unwinding

logger = logging.getLogger("celery_saga")


class ReversalRuns(ReversalOutcomes):
    """The handler of a claimed reversal, and what its outcome leads to; the unwinder
    (its subclass) publishes and follows the unwind."""

    def follow(
        self, definition: SagaDefinition, execution_id: str, plan: UnwindStep | None
    ) -> None:
        raise NotImplementedError  # the unwinder's

    def _publish(
        self, definition: SagaDefinition, held: ReversalAttempt, countdown: float | None = None
    ) -> None:
        raise NotImplementedError  # the unwinder's

    def _run_reversal(
        self,
        definition: SagaDefinition,
        held: ReversalAttempt,
        unwinding: Unwinding,
        spec: StepSpec,
        record: StepRecord,
    ) -> Outcome:
        """Run the reversal this worker claimed (``held``; ``record`` as claimed) and
        record it."""
        timeout = spec.compensation_timeout or self.settings.compensation_timeout
        execution_id, attempt = held.execution_id, held.attempt
        key = record_key(execution_id, record.name, "compensate")
        fields = {
            "execution_id": execution_id,
            "saga": definition.name,
            "step": record.name,
            "attempt": attempt,
            "idempotency_key": key,
            "forward_key": record.idempotency_key,
        }
        self.emit("saga-compensation-started", fields)
        what = f"the reversal of step {record.name!r} of execution {execution_id}"
        stopped: BaseException | None = None
        with (
            self.holding(self.renewals.of_reversal(held), what),
            attempt_running("reversal", execution_id, record.name, attempt, None, held.holder),
        ):
            try:
                ctx = reversal_context(self.db, definition, unwinding, record, key, attempt)
            except (SQLAlchemyError, PayloadKeyError):
                raise  # reading the context failed, not the reversal: its claim expires
            except Exception as error:  # e.g. the soft time limit, spent before the handler
                failed = self._reversal_failed(definition, held, unwinding, spec, error, fields)
                return no_body_if_taken_over(failed)
            try:
                kwargs = call_arguments(
                    spec.compensation, ctx, spec.compensation_args, extra={"result": record.result}
                )
                call = body_of(spec.compensation)
                result = run_body(
                    spec.compensation,
                    lambda: call(kwargs),
                    timeout,
                    f"reversal of step {record.name!r} of saga {definition.name!r}",
                )
            except (Exception, SystemExit) as error:
                # The handler's own errors, database errors of its own included; only the
                # worker's own shutdown is not the reversal's (given up below).
                if not worker_is_stopping(error):
                    return self._reversal_failed(definition, held, unwinding, spec, error, fields)
                stopped = error
            else:
                compensated = CompensationOutcome.COMPENSATED
                plan = self.record_outcome(definition, held, compensated, None, unwinding)
        if stopped is not None:
            return self.interrupted(definition, held, stopped)
        self.emit("saga-step-compensated", fields)
        self.follow(definition, execution_id, plan)
        return Ran(result)

    def _reversal_failed(
        self,
        definition: SagaDefinition,
        held: ReversalAttempt,
        unwinding: Unwinding,
        spec: StepSpec,
        error: BaseException,
        fields: dict[str, object],
    ) -> Outcome:
        execution_id, attempt = held.execution_id, held.attempt
        secrets = failure_secrets(self.db, definition, execution_id)
        scrub_exception(error, secrets)
        reason = scrub(describe_error(error), secrets)
        log_failure(
            logger,
            logging.WARNING if attempt < spec.compensation_retry else logging.ERROR,
            "saga %r execution %s: reversal of step %r attempt %d failed: %s",
            definition.name,
            execution_id,
            held.name,
            attempt,
            reason,
            error=error,
            secrets=secrets,
        )
        description = attempt_failed(
            "reversal of step", definition.name, held.name, attempt, reason
        )
        if attempt < spec.compensation_retry:

            def release() -> bool:
                now = get_clock().now()
                return unwind.release_compensation(self.db, held, reason=reason, now=now)

            if not (release() or (self.lost_claims.reversal(held) in MINE and release())):
                return TakenOver(f"{description}; its claim was taken over")
            delay = backoff_delay(attempt, spec.backoff, spec.backoff_max, get_clock().random())
            self.emit("saga-compensation-retry", {**fields, "error": reason, "countdown": delay})
            following = replace(held, attempt=attempt + 1)
            self._publish(definition, following, countdown=delay)
            return Retrying(f"{description}; retry in {delay:.3g}s", delay, body_error())
        plan = self.record_outcome(definition, held, CompensationOutcome.FAILED, reason, unwinding)
        self.emit("saga-compensation-failed", {**fields, "error": reason})
        self.follow(definition, execution_id, plan)
        return Failed(description, body_error())
