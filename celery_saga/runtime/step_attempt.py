"""A claimed step attempt's side of ``run_attempt``: its context, its body, and what its
result or its failure records (retry with a countdown, or fail for good and unwind)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.lost_claims import ClaimState
from celery_saga.decisions.retry import plan_retry
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode, StepSpec
from celery_saga.errors import (
    PayloadError,
    SchemaValidationError,
    StepRetryRequested,
)
from celery_saga.records import Attempt, StepRecord
from celery_saga.redaction import scrub
from celery_saga.runtime.attempt import attempt_fields
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context_builder import Snapshot, step_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import body_error, invoke_step
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import Announce, Move, PublishNode, Stay, then
from celery_saga.runtime.navigation import Position, next_position
from celery_saga.runtime.outcomes import (
    Failed,
    Outcome,
    Ran,
    Retrying,
    Stopped,
    TakenOver,
    attempt_failed,
)
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.revocation import stopped_by_revoke
from celery_saga.runtime.scrubbing import (
    failure_secrets,
    log_failure,
    scrub_exception,
    shown_result,
)
from celery_saga.runtime.step_outcomes import StepOutcomes
from celery_saga.runtime.stopping import RESEND_AFTER
from celery_saga.runtime.takeovers import keep_late_outcome
from celery_saga.runtime.timeouts import cut_short
from celery_saga.store import claims, forward
from celery_saga.store.codec import pack
from celery_saga.tracing.spans import OFF, AttemptSpan

logger = logging.getLogger("celery_saga")


def claim_step(
    parts: Parts,
    definition: SagaDefinition,
    position: Position,
    message: NodeMessage,
    record: StepRecord | None,
    holder: str,
    span: AttemptSpan = OFF,
) -> int | None:
    """Claim the step at ``position`` for ``holder`` (this process; ``record``: as read,
    None when it has none yet), with the attempt's ``span`` (its traceparent kept for its
    reversal's link); its attempt number, or None if the claim was refused."""
    spec = position.spec
    assert spec is not None
    now = get_clock().now()
    parallel = isinstance(definition.nodes[message.node], ParallelNode)
    return forward.claim_step(
        parts.db,
        execution_id=message.execution_id,
        name=position.record_name,
        node=message.node,
        sub=message.sub,
        definition_hash=definition.hash,
        idempotency_key=record_key(message.execution_id, position.record_name, "forward"),
        compensatable=spec.compensatable,
        lease_expires_at=now + timedelta(seconds=parts.lease),
        now=now,
        existing=record,
        holder=holder,
        # A group settles together: its members are never held alone (a pause holds the
        # run at the next step that is not a member).
        pause_step=None if parallel else spec.name,
        trace_context=span.traceparent,
    )


@dataclass
class StepSide:
    """The forward side of ``run_attempt``: one claimed attempt (``held``) of the step at
    ``position``, as ``message`` named it; ``snapshot``: the run with all its steps, if
    read (its context is read from it)."""

    parts: Parts
    outcomes: StepOutcomes
    definition: SagaDefinition
    position: Position
    message: NodeMessage
    held: Attempt
    snapshot: Snapshot | None
    #: Its span, begun before its claim (``celery_saga.tracing``).
    span: AttemptSpan = OFF
    #: Its idempotency key and the fields of its events, made once (cached_property
    #: takes a lock at each read on Python 3.11).
    key: str = field(init=False)
    fields: dict[str, Any] = field(init=False)
    spec: StepSpec = field(init=False)

    def __post_init__(self) -> None:
        assert self.position.spec is not None
        self.spec = self.position.spec
        self.key = record_key(self.held.execution_id, self.held.name, "forward")
        self.fields = attempt_fields(self.definition, self.held, self.key)

    @property
    def compensatable(self) -> bool | None:
        return self.spec.compensatable

    @property
    def label(self) -> str:
        return f"step {self.held.name!r}"

    def context(self) -> Any:
        held, position = self.held, self.position
        loop = (position.iteration, position.item, position.for_each)
        return step_context(
            self.parts.db,
            self.definition,
            self.spec,
            held.name,
            held.execution_id,
            self.key,
            held.attempt,
            self.snapshot,
            loop,
        )

    def call(self, ctx: Any) -> tuple[Any, bytes]:
        result = invoke_step(self.definition.name, self.spec, ctx)
        blob = pack(
            result,
            what=f"result of step {self.held.name!r} of saga {self.definition.name!r}",
            limit=self.parts.settings.max_payload_bytes,
        )
        return result, blob

    def succeeded(self, returned: tuple[Any, bytes]) -> tuple[Outcome, Move]:
        """Record the result and move on; a claim no longer ours keeps the result on the
        run's history instead (guarantee 30)."""
        result, blob = returned
        definition, held, message = self.definition, self.held, self.message
        name, execution_id = held.name, held.execution_id
        onward = next_position(definition, message.node, message.sub, self.position.length)
        shown = shown_result(definition, name, result)
        move = self.outcomes.completed(definition, held, blob, onward, self.fields)
        if move is not None:
            return Ran(shown), move
        cancelling = self.outcomes.ended_while_cancelling(held)
        if cancelling is not None:
            return TakenOver(f"step {name!r} of a cancelled run", shown), cancelling
        try:
            by_other = self.parts.lost_claims.step(held, None) is ClaimState.TAKEN
        except SQLAlchemyError:  # the result is kept all the same, best effort
            by_other = True
        keep_late_outcome(
            self.parts.db,
            execution_id,
            f"step {name!r}",
            name,
            held.attempt,
            self.key,
            blob,
            held.holder,
            by_other,
        )
        taken = f"step {name!r} of execution {execution_id} attempt {held.attempt}"
        return TakenOver(taken, shown), Stay()

    def failed(self, error: BaseException) -> tuple[Outcome, Move]:
        definition, step = self.definition, self.held
        cause = error.cause if isinstance(error, StepRetryRequested) else None
        secrets = failure_secrets(self.parts.db, definition, step.execution_id, self.parts.registry)
        for raised in (error, cause):
            if raised is not None:
                scrub_exception(raised, secrets)
        reason = scrub(describe_error(cause or error), secrets)
        description = attempt_failed("step", definition.name, step.name, step.attempt, reason)
        fields = {**self.fields, "error": reason}
        if cut_short(error):  # the signal itself, or an error raised while unwinding from it
            cancelling = self.outcomes.ended_while_cancelling(step)
            if cancelling is not None:
                if stopped_by_revoke(step.holder):
                    return Stopped(f"{description}: stopped by the run's cancel"), cancelling
                # Its own timeout, which no revoke announced: it ends as any timed-out
                # attempt does, since a task ended with Ignore would stay STARTED
                # (tests/test_flower.py).
                failed = Failed(f"{description}; the run is being cancelled", body_error())
                return failed, cancelling
        delay = _retry_delay(self.spec, step.attempt, error)
        final = delay is None
        log_failure(
            logger,
            logging.ERROR if final else logging.WARNING,
            "saga %r execution %s: step %r attempt %d failed: %s",
            definition.name,
            step.execution_id,
            step.name,
            step.attempt,
            reason,
            error=None if _traced_by_celery(error) or (cause and not final) else error,
            secrets=secrets,
        )
        if delay is not None:
            retry = self._retry(reason, fields, delay)
            if retry is not None:
                retrying = Retrying(f"{description}; retry in {delay:.3g}s", delay, body_error())
                return retrying, retry
            cancelling = self.outcomes.ended_while_cancelling(step)
            return TakenOver(f"{description}; its claim was taken over"), cancelling or Stay()
        move = self.outcomes.failed(definition, step, reason, error)
        return Failed(description, body_error()), then(move, Announce("saga-step-failed", fields))

    def _retry(self, reason: str, fields: dict[str, Any], delay: float) -> Move | None:
        """Release the claim and send the next attempt with a countdown (no slot held);
        None: the claim was no longer ours."""
        db, step = self.parts.db, self.held

        def record() -> bool:
            return claims.release(db, step, reason=reason, now=get_clock().now())

        if not (record() or (self.parts.restore_step(self.definition, step) and record())):
            return None
        self.parts.emit("saga-step-retry", {**fields, "countdown": delay})
        following = replace(self.message, attempt=step.attempt + 1)
        return PublishNode(self.definition, following, spec=self.spec, countdown=delay)

    def give_up_claim(self) -> bool:
        now, why = get_clock().now(), "its worker is shutting down"
        return claims.give_up(self.parts.db, self.held, now=now, why=why)

    def send_again(self) -> None:
        definition = self.definition
        self.parts.publisher.publish_node(
            definition.name,
            self.spec,
            self.message,
            countdown=RESEND_AFTER,
            version=definition.hash,
        )


def _traced_by_celery(error: BaseException) -> bool:
    """Whether the step's own task ends with ``error``, so Celery logs it with its traceback
    (once is enough; ``self.retry()`` asked for the attempt: no traceback anywhere)."""
    return body_error() is error


def _retry_delay(spec: StepSpec, attempt: int, error: BaseException) -> float | None:
    """None when this failure is final (the same value would be refused again, or no
    attempt is left), else the seconds until the next attempt."""
    if isinstance(error, (PayloadError, SchemaValidationError)):
        return None
    requested = None
    if isinstance(error, StepRetryRequested):
        requested = (error.countdown, error.max_retries)
    backoff = (spec.backoff, spec.backoff_max)
    return plan_retry(attempt, spec.retry, requested, backoff, get_clock().random())
