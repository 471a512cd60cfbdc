"""A claimed reversal's side of ``run_attempt``: its handler's context and call, and what
its outcome records (guarantees 1-7, 20, 27, 30)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from celery_saga.decisions.lost_claims import MINE
from celery_saga.decisions.retry import backoff_delay
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.records import Attempt, CompensationOutcome, Direction, StepRecord
from celery_saga.redaction import scrub
from celery_saga.runtime.async_bodies import run_body
from celery_saga.runtime.attempt import attempt_fields
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context_builder import reversal_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import body_error, body_of, call_arguments
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import Announce, FollowUnwind, Move, PublishReversal, then
from celery_saga.runtime.outcomes import (
    Failed,
    Outcome,
    Ran,
    Retrying,
    TakenOver,
    attempt_failed,
)
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.reversal_outcome import ReversalOutcomes
from celery_saga.runtime.scrubbing import failure_secrets, log_failure, scrub_exception
from celery_saga.runtime.stopping import RESEND_AFTER
from celery_saga.store import claims, reversal, unwind
from celery_saga.store.reversal import Unwinding
from celery_saga.tracing.carry import carried
from celery_saga.tracing.spans import AttemptSpan

logger = logging.getLogger("celery_saga")


def claim_next(parts: Parts, asked: Attempt, with_run: bool) -> tuple[Attempt, Unwinding] | None:
    """Claim the reversal ``asked`` names if it is the unwind's next, on a first delivery
    (the claim's WHERE clause is the admission rule); the attempt as held and the run as
    the claim read it (its row too, ``with_run``), or None."""
    now, me = get_clock().now(), parts.holders.me()
    held = replace(asked, claimed_at=now, holder=me)
    lease = get_clock().now() + timedelta(seconds=parts.lease)
    claimed = reversal.claim_next_reversal(
        parts.db, held, lease_expires_at=lease, with_run=with_run, holder=me
    )
    return None if claimed is None else (held, claimed)


def claim_after(
    parts: Parts, unwinding: Unwinding, record: StepRecord, seen_lease: datetime | None
) -> tuple[Attempt, Unwinding, StepRecord] | None:
    """Claim the next attempt of ``record``'s reversal, admitted on the run as read
    (``seen_lease``: the live lease it takes over); the attempt, the run and the record as
    claimed, or None if another claimed it first."""
    lease = get_clock().now() + timedelta(seconds=parts.lease)
    now, me = get_clock().now(), parts.holders.me()
    attempt = record.compensation_attempts + 1
    held = Attempt.reversal(record.execution_id, record.name, attempt, now, me)
    if not unwind.claim_compensation(
        parts.db,
        held,
        lease_expires_at=lease,
        now=now,
        holder=me,
        seen_lease=seen_lease,
        previous=record,
    ):
        return None
    claimed = replace(
        record,
        compensation_attempts=held.attempt,
        compensation_lease_expires_at=lease,
        compensation_holder=me,
    )
    steps = [claimed if s.id == record.id else s for s in unwinding.steps]
    return held, Unwinding(unwinding.run, steps), claimed


@dataclass
class ReversalSide:
    """The reverse side of ``run_attempt``: the reversal this worker claimed (``held``;
    ``record`` as claimed) of a run as its claim found it (``unwinding``)."""

    parts: Parts
    outcomes: ReversalOutcomes
    definition: SagaDefinition
    held: Attempt
    unwinding: Unwinding
    spec: StepSpec
    record: StepRecord
    compensatable: bool | None = None
    #: Its idempotency key and the fields of its events, made once.
    key: str = field(init=False)
    fields: dict[str, Any] = field(init=False)
    #: Its span, linked to the forward attempt's it undoes (``celery_saga.tracing``).
    span: AttemptSpan = field(init=False)

    @property
    def label(self) -> str:
        return f"the reversal of step {self.held.name!r}"

    @property
    def trace(self) -> str | None:
        """The run's stored trace: read with the run, else carried by the message."""
        run = self.unwinding.run
        return (run.trace_context if run else None) or carried()

    def __post_init__(self) -> None:
        self.key = record_key(self.held.execution_id, self.record.name, "compensate")
        self.fields = {
            **attempt_fields(self.definition, self.held, self.key),
            "forward_key": self.record.idempotency_key,
        }
        definition, held = self.definition, self.held
        run = (definition.name, definition.hash, held.execution_id)
        traces = (self.trace, self.record.trace_context)
        self.span = self.parts.tracer.attempt(Direction.REVERSE, run, held.name, self.key, traces)

    def context(self) -> Any:
        return reversal_context(
            self.parts.db, self.definition, self.unwinding, self.record, self.key, self.held.attempt
        )

    def call(self, ctx: Any) -> Any:
        spec, record = self.spec, self.record
        assert spec.compensation is not None
        kwargs = call_arguments(
            spec.compensation, ctx, spec.compensation_args, extra={"result": record.result}
        )
        call = body_of(spec.compensation)
        return run_body(
            spec.compensation,
            lambda: call(kwargs),
            spec.compensation_timeout or self.parts.settings.compensation_timeout,
            f"reversal of step {record.name!r} of saga {self.definition.name!r}",
        )

    def succeeded(self, result: Any) -> tuple[Outcome, Move]:
        compensated = CompensationOutcome.COMPENSATED
        held, definition = self.held, self.definition
        plan = self.outcomes.record_outcome(definition, held, compensated, None, self.unwinding)
        follow = FollowUnwind(definition, held.execution_id, plan)
        return Ran(result), then(Announce("saga-step-compensated", self.fields), follow)

    def failed(self, error: BaseException) -> tuple[Outcome, Move]:
        definition, held, spec = self.definition, self.held, self.spec
        execution_id, attempt = held.execution_id, held.attempt
        secrets = failure_secrets(self.parts.db, definition, execution_id, self.parts.registry)
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
            retry = self._retry(reason)
            if retry is None:
                return TakenOver(f"{description}; its claim was taken over"), then()
            delay = retry.countdown or 0.0
            return Retrying(f"{description}; retry in {delay:.3g}s", delay, body_error()), retry
        failed = CompensationOutcome.FAILED
        plan = self.outcomes.record_outcome(definition, held, failed, reason, self.unwinding)
        self.parts.emit("saga-compensation-failed", {**self.fields, "error": reason})
        follow = FollowUnwind(definition, execution_id, plan)
        return Failed(description, body_error()), follow

    def _retry(self, reason: str) -> PublishReversal | None:
        """Release the claim and send the next attempt with a backoff; None: the claim was
        no longer ours."""
        parts, held, spec = self.parts, self.held, self.spec

        def release() -> bool:
            now = get_clock().now()
            return claims.release(parts.db, held, reason=reason, now=now)

        if not (release() or (parts.lost_claims.reversal(held) in MINE and release())):
            return None
        delay = backoff_delay(held.attempt, spec.backoff, spec.backoff_max, get_clock().random())
        retry = {**self.fields, "error": reason, "countdown": delay}
        parts.emit("saga-compensation-retry", retry)
        following = replace(held, attempt=held.attempt + 1)
        return PublishReversal(
            self.definition, held.execution_id, held.name, following.attempt, delay
        )

    def give_up_claim(self) -> bool:
        now, why = get_clock().now(), "its worker is shutting down"
        return claims.give_up(self.parts.db, self.held, now=now, why=why)

    def send_again(self) -> None:
        held, definition = self.held, self.definition
        self.parts.publisher.publish_compensation(
            definition.name,
            self.spec,
            held.execution_id,
            held.name,
            held.attempt,
            countdown=RESEND_AFTER,
            version=definition.hash,
        )
