"""What the forward executor does when a step attempt fails, or a run must fail outside
any step: retry with a countdown, or record the failure and begin the unwind."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.retry import plan_retry
from celery_saga.decisions.unwind import UnwindKind, UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode, StepSpec
from celery_saga.errors import (
    PayloadError,
    SchemaValidationError,
    StepRetryRequested,
    StepTimeoutError,
)
from celery_saga.records import (
    ExecutionRecord,
    ExecutionState,
    StepAttempt,
    StepRecord,
    StepStatus,
)
from celery_saga.redaction import scrub
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import body_error
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.navigation import Position
from celery_saga.runtime.outcomes import (
    Failed,
    Interrupted,
    Outcome,
    Retrying,
    Stopped,
    TakenOver,
    attempt_failed,
)
from celery_saga.runtime.ports import RuntimeParts
from celery_saga.runtime.revocation import stopped_by_revoke
from celery_saga.runtime.scrubbing import failure_secrets, log_failure, scrub_exception
from celery_saga.runtime.stopping import RESEND_AFTER, give_up
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.runtime.unwinder import Unwinder, compensations_of
from celery_saga.store import forward, joins, queries, recovery, step_failure
from celery_saga.store.forward import GroupResult

logger = logging.getLogger("celery_saga")


class StepFailures(RuntimeParts):
    unwinder: Unwinder

    def landed(self, step: StepAttempt, status: StepStatus) -> bool:
        """Whether an earlier try of this attempt's outcome write committed: asked before
        retrying a write whose reply was lost with its connection."""
        record = queries.load_step(self.db, step.execution_id, step.name)
        if record is None or record.status is not status or record.attempts != step.attempt:
            return False
        return step.holder is None or record.holder == step.holder

    def settle(
        self,
        definition: SagaDefinition,
        step: StepAttempt,
        members: list[str],
        step_advance: Advance,
        *,
        result_blob: bytes | None = None,
        error: str | None = None,
        cause: BaseException | None = None,
    ) -> GroupResult | None:
        """Record a parallel member's result or a step's final failure, retried through
        store outages; the last member to settle decides for the node (guarantee 20)."""
        status = StepStatus.FAILED if error is not None else StepStatus.COMPLETED

        def landed() -> bool:
            if not self.landed(step, status):
                return False
            # Ours committed but what it decided is unknown here: the timer sweep sends
            # whatever the run's record says is next.
            recovery.mark_message_owed(
                self.db, execution_id=step.execution_id, now=get_clock().now()
            )
            return True

        def record() -> GroupResult | None:
            fields: dict[str, Any] = {
                "members": members,
                "advance": step_advance,
                "compensations": compensations_of(definition),
                "now": get_clock().now(),
            }
            if error is not None:
                return step_failure.record_step_failed(self.db, step, error=error, **fields)
            return joins.record_step_settled(self.db, step, result_blob=result_blob, **fields)

        unknown: GroupResult | None = GroupResult(settled=False)
        result = write_outcome(
            record,
            budget=self.settings.outcome_retry_budget,
            what=f"the outcome of step {step.name!r} of execution {step.execution_id}",
            landed=landed,
            if_landed=unknown,
            cause=cause,
            restore=lambda: self.restore_step(definition, step),
        )
        return self._ended_by_us(step.execution_id) if result is unknown else result

    def _ended_by_us(self, execution_id: str) -> GroupResult:
        """After a lost reply: when the write that landed ended the run (failed with nothing
        to reverse, or completed), its end is announced here, to monitors and to a parent
        run, as the write's own caller would have; the sweep carries on any other run. (No
        one else moves the run meanwhile: its next message is owed, not sent.)"""
        execution = queries.load_execution(self.db, execution_id)
        if execution is not None and execution.state is ExecutionState.COMPLETED:
            return GroupResult(settled=True)
        if execution is None or execution.state is not ExecutionState.FAILED:
            return GroupResult(settled=False)
        done = UnwindStep(UnwindKind.DONE, rollback_status=execution.rollback_status)
        return GroupResult(settled=True, failure_reason=execution.failure_reason, unwind=done)

    def _step_failed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        step: StepAttempt,
        error: BaseException,
    ) -> Outcome:
        spec, name, attempt = position.spec, step.name, step.attempt
        assert spec is not None
        cause = error.cause if isinstance(error, StepRetryRequested) else None
        secrets = failure_secrets(self.db, definition, message.execution_id)
        for raised in (error, cause):
            if raised is not None:
                scrub_exception(raised, secrets)
        reason = scrub(describe_error(cause or error), secrets)
        description = attempt_failed("step", definition.name, name, attempt, reason)
        fields = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "step": name,
            "attempt": attempt,
            "idempotency_key": record_key(message.execution_id, name, "forward"),
            "error": reason,
        }
        stopped = isinstance(error, (SoftTimeLimitExceeded, StepTimeoutError))
        if stopped and self.refused_while_cancelling(step):
            if stopped_by_revoke(step.holder):
                return Stopped(f"{description}: stopped by the run's cancel")
            # Its own timeout, which no revoke announced: it ends as any timed-out attempt
            # does, since a task ended with Ignore would stay STARTED (tests/test_flower.py).
            return Failed(f"{description}; the run is being cancelled", body_error())
        delay = _retry_delay(spec, attempt, error)
        final = delay is None
        log_failure(
            logger,
            logging.ERROR if final else logging.WARNING,
            "saga %r execution %s: step %r attempt %d failed: %s",
            definition.name,
            message.execution_id,
            name,
            attempt,
            reason,
            error=None if _traced_by_celery(error) or (cause and not final) else error,
            secrets=secrets,
        )
        if delay is not None:
            if self._schedule_retry(definition, position, message, step, reason, fields, delay):
                return Retrying(f"{description}; retry in {delay:.3g}s", delay, body_error())
            self.refused_while_cancelling(step)
            return TakenOver(f"{description}; its claim was taken over")
        members = _members(definition, step)
        self.settle_failure(definition, step, members, reason, error)
        self.emit("saga-step-failed", fields)
        return Failed(description, body_error())

    def interrupted(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        held: StepAttempt,
        error: BaseException,
    ) -> Outcome:
        """The worker's shutdown cut the body short: record nothing, give the claim up and
        send the step's message again, so the next worker runs it at once. The attempt still
        counts (guarantee 27: at most ``retry + 1`` whatever ends them)."""
        what = f"step {held.name!r} attempt {held.attempt}"
        where = f"saga {definition.name!r} execution {held.execution_id}"
        description = give_up(
            lambda: forward.give_up_step_claim(
                self.db, held, now=get_clock().now(), why="its worker is shutting down"
            ),
            lambda: self.publisher.publish_node(
                definition.name, spec, message, countdown=RESEND_AFTER, version=definition.hash
            ),
            where,
            what,
        )
        return Interrupted(description, error)

    def _exhausted(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        record: StepRecord | None,
        claim: Callable[[], int | None],
    ) -> bool:
        """An attempt that never settled (its worker died, or it ran past its lease) counts
        like one that raised: after ``retry + 1`` executions the step fails instead of being
        run again (guarantee 27). The lapsed claim is taken over first (a compare-and-set
        on the lease read), so a holder that renewed its lease meanwhile keeps its step."""
        spec = position.spec
        if record is None or spec is None or record.status is not StepStatus.RUNNING:
            return False
        # ``retry`` attempts may fail by raising; one lost attempt more is allowed, so a
        # crash never costs a step with ``retry=1`` its only run (guarantee 27: retry + 1).
        if record.attempts <= spec.retry:
            return False
        reason = (
            f"WorkerLostError: attempt {record.attempts} of step {record.name!r} never "
            "finished (its worker stopped, or it outlived its lease) and no attempt is left"
        )
        taken = claim()
        if taken is None:
            logger.info("execution %s: step %r is held again", message.execution_id, record.name)
            return True
        logger.warning("saga %r execution %s: %s", definition.name, message.execution_id, reason)
        step = StepAttempt(
            message.execution_id,
            position.record_name,
            message.node,
            message.sub,
            taken,
            get_clock().now(),
            self.holders.me(),
        )
        self.settle_failure(definition, step, _members(definition, step), reason, None)
        return True

    def settle_failure(
        self,
        definition: SagaDefinition,
        step: StepAttempt,
        members: list[str],
        reason: str,
        error: BaseException | None,
    ) -> None:
        """Record ``step`` failed for good; the last member to settle fails the run and
        begins its unwind. A store that stays unreachable re-raises ``error``."""
        stay = Advance(step.node, step.sub, False, False)
        group = self.settle(definition, step, members, stay, error=reason, cause=error)
        if group is None:
            self.refused_while_cancelling(step)
        elif group.settled and group.unwind is not None:
            self.unwinder.begin(definition, step.execution_id, group.unwind, group.failure_reason)

    def _schedule_retry(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        step: StepAttempt,
        reason: str,
        fields: dict[str, Any],
        delay: float,
    ) -> bool:
        """Release the claim and publish the next attempt with a countdown (no slot held);
        False: the claim was no longer ours."""
        spec = position.spec
        assert spec is not None

        def record() -> bool:
            return forward.record_step_retry(self.db, step, error=reason, now=get_clock().now())

        if record() or (self.restore_step(definition, step) and record()):
            self.emit("saga-step-retry", {**fields, "countdown": delay})
            following = replace(message, attempt=step.attempt + 1)
            self.publisher.publish_node(
                definition.name, spec, following, countdown=delay, version=definition.hash
            )
            return True
        return False

    def refused_while_cancelling(self, step: StepAttempt) -> bool:
        """An attempt's outcome met a run being cancelled (or, for a stopped body, will):
        give its claim up and let the cancel go on; False if the run is not cancelling."""
        execution = queries.load_execution(self.db, step.execution_id)
        if execution is None or execution.state is not ExecutionState.CANCELLING:
            return False
        forward.give_up_step_claim(
            self.db, step, now=get_clock().now(), why="it ended after the run's cancel"
        )
        logger.info(
            "execution %s: step %r attempt %d ended after the run's cancel; not recorded",
            step.execution_id,
            step.name,
            step.attempt,
        )
        self.continue_cancel(execution)
        return True

    def continue_cancel(self, execution: ExecutionRecord) -> None:
        raise NotImplementedError  # the executor's

    def fail_outside_step(
        self,
        definition: SagaDefinition,
        execution_id: str,
        reason: str,
        at: tuple[int, int] | None = None,
    ) -> None:
        """Fail a live run for a reason no step raised (a choice that could not be made, a
        changed definition) and begin its unwind; ``at``: the (node, sub) it was found at,
        which the ``saga-forward-failed`` event carries."""
        reason = scrub(reason, failure_secrets(self.db, definition, execution_id))
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
            self.unwinder.begin(definition, execution_id, plan, reason, at)


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


def _members(definition: SagaDefinition, step: StepAttempt) -> list[str]:
    """The records that settle the node together: a parallel group's, or just this one."""
    target = definition.nodes[step.node]
    return [s.name for s in target.steps] if isinstance(target, ParallelNode) else [step.name]
