"""The unwind: one reversal per message, in reverse start order, halting on
the first definitive failure (guarantees 1-9, 20)."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.admission import Admission
from celery_saga.decisions.retry import backoff_delay
from celery_saga.decisions.unwind import (
    UnwindKind,
    UnwindStep,
    compensation_admission,
    next_unwind_step,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    ReversalAttempt,
    StepRecord,
)
from celery_saga.runtime import unwind_exits
from celery_saga.runtime.async_bodies import run_body
from celery_saga.runtime.child_unwind import ChildUnwind
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.contexts import reversal_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import body_error, body_of, call_arguments, reversal_needs_run
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import (
    BeginUnwind,
    FollowUnwind,
    PublishNode,
    PublishReversal,
    RecordReversal,
    Stay,
    UnwindMove,
    unreachable,
)
from celery_saga.runtime.outcomes import (
    Failed,
    NoBody,
    Outcome,
    Ran,
    Retrying,
    TakenOver,
    attempt_failed,
    no_body_if_taken_over,
)
from celery_saga.runtime.reversal_outcome import ReversalOutcomes
from celery_saga.runtime.stopping import worker_is_stopping
from celery_saga.store import queries, reversal, unwind
from celery_saga.store.reversal import Unwinding

logger = logging.getLogger("celery_saga")


def compensations_of(definition: SagaDefinition | None) -> frozenset[str]:
    """Names of the records the deployed definition can reverse (none if it is unknown)."""
    return frozenset() if definition is None else definition.reversible


class Unwinder(ReversalOutcomes):
    """Runs one reversal per compensate message and decides the next move."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children = ChildUnwind(self.parts())

    def carry_out(self, move: UnwindMove) -> None:
        """Do what a helper decided: the store write that follows it, then the publish."""
        match move:
            case Stay():
                pass
            case BeginUnwind(definition, execution_id, plan, reason):
                self.begin(definition, execution_id, plan, reason)
            case FollowUnwind(definition, execution_id, plan):
                self.follow(definition, execution_id, plan)
            case PublishNode(definition, message, label):
                self.publisher.publish_node(
                    definition.name, None, message, label=label, version=definition.hash
                )
            case PublishReversal(definition, execution_id, record):
                self.publish_reversal(definition, execution_id, record)
            case RecordReversal(definition, execution_id):
                self.follow(definition, execution_id, self.record_child_reversal(move))
            case _:
                unreachable(move)

    def begin(
        self,
        definition: SagaDefinition,
        execution_id: str,
        plan: UnwindStep,
        failure_reason: str | None,
    ) -> None:
        """Carry out the first move of an unwind that the failure record just decided."""
        self.emit(
            "saga-forward-failed",
            {"execution_id": execution_id, "saga": definition.name, "reason": failure_reason},
        )
        self.follow(definition, execution_id, plan)

    def settled(self, definition: SagaDefinition, execution_id: str) -> None:
        """The run ended or parked: a child tells its parent (guarantee 17)."""
        if self.registry.may_be_child(definition.name):
            self.carry_out(self.children.notify_parent(execution_id))

    def follow(
        self, definition: SagaDefinition, execution_id: str, plan: UnwindStep | None
    ) -> None:
        fields = {"execution_id": execution_id, "saga": definition.name}
        if plan is None:
            return
        if plan.kind is UnwindKind.COMPENSATE:
            assert plan.record is not None
            self.publish_reversal(definition, execution_id, plan.record)
            return
        if plan.kind is UnwindKind.DONE:
            assert plan.rollback_status is not None
            self.emit("saga-failed", {**fields, "rollback_status": plan.rollback_status.value})
        else:
            if plan.kind is UnwindKind.HALT_VANISHED:
                # The plan was made before parking; parking is what records it.
                plan = unwind.plan_unwind(
                    self.db,
                    execution_id=execution_id,
                    compensations=compensations_of(definition),
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
            self.emit("saga-compensation-stuck", {**fields, "step": step})
        self.settled(definition, execution_id)

    def publish_reversal(
        self, definition: SagaDefinition, execution_id: str, record: StepRecord
    ) -> None:
        """The message for the next attempt owed to ``record``'s reversal."""
        following = record.compensation_attempts + 1
        self._publish(definition, ReversalAttempt(execution_id, record.name, following))

    def _publish(
        self, definition: SagaDefinition, held: ReversalAttempt, countdown: float | None = None
    ) -> None:
        self.publisher.publish_compensation(
            definition.name,
            definition.find_step(held.name),
            held.execution_id,
            held.name,
            held.attempt,
            countdown,
            version=definition.hash,
        )

    def run(
        self,
        execution_id: str,
        step_name: str,
        attempt: int,
        redelivered: bool = False,
        saga_name: str | None = None,
        version: str | None = None,
    ) -> Outcome:
        """Handle one compensate message (of a run on ``version``, when the message names
        it); in-flight duplicates as in ``Executor.run_node``, a run whose version this
        process lacks raises ``VersionNotDeployedError`` before anything is claimed.

        Fast path (first delivery, where the store claims in one statement): claim at once,
        the claim's WHERE clause being the admission rule, and take the run from the claim.
        Anything else, or a refused claim, reads the run and lets ``compensation_admission``
        decide.
        """
        if saga_name is not None and not redelivered:
            outcome = self._run_first_delivery(saga_name, execution_id, step_name, attempt, version)
            if outcome is not None:
                return outcome
        now = get_clock().now()
        execution, steps = queries.load_snapshot(self.db, execution_id)
        if execution is None or execution.state is not ExecutionState.COMPENSATING:
            return _refused(execution_id, step_name, "run is not compensating")
        # Compensations of the run's own version only; without it the message goes back.
        definition = self.registry.for_run(
            execution.saga_name, execution.definition_hash, execution.id
        )
        compensations = compensations_of(definition)
        planned = next_unwind_step(steps, execution.committed_at is not None, compensations)
        if planned.kind is not UnwindKind.COMPENSATE:
            plan = unwind.plan_unwind(
                self.db, execution_id=execution_id, compensations=compensations, now=now
            )
            self.follow(definition, execution_id, plan)
            return NoBody("the unwind has no reversal to run here")
        record = next((s for s in steps if s.name == step_name), None)
        if planned.record is not None and planned.record.child_execution_id is not None:
            if record is None or record.id != planned.record.id:
                return _refused(execution_id, step_name, "not next")
            return self._reverse_child(definition, execution, planned.record)
        lease = record.compensation_lease_expires_at if record else None
        verdict = compensation_admission(
            record, planned, attempt, lease is not None and lease > now
        )
        if verdict is Admission.REJECT_IN_FLIGHT and redelivered and record and lease:
            logger.warning(
                "execution %s: redelivered reversal of step %r held back until the lease of "
                "the attempt in flight ends (its worker may be the one that died)",
                execution_id,
                step_name,
            )
            countdown = (lease - now).total_seconds() + 1
            again = ReversalAttempt(execution_id, step_name, attempt)
            self._publish(definition, again, countdown=countdown)
            return NoBody("held back until the lease in flight ends")
        if verdict is not Admission.RUN or record is None:
            return _refused(execution_id, step_name, verdict.value)
        spec = definition.find_step(step_name)
        assert spec is not None and spec.compensation is not None
        if lease is not None and record.compensation_attempts > spec.compensation_retry:
            plan = self.lost_too_often(definition, Unwinding(execution, steps), record)
            self.follow(definition, execution_id, plan)
            return NoBody("no attempt left after lost ones")
        return self._reverse(definition, execution, steps, spec, record)

    def _reverse_child(
        self, definition: SagaDefinition, parent: ExecutionRecord, record: StepRecord
    ) -> Outcome:
        """The parent's unwind reached its record of a child: a reversal that failed (the
        child cannot be cleanly unwound) ends its task as failed, as any reversal does."""
        move = self.children.reverse(definition, parent, record)
        if not isinstance(move, RecordReversal):
            self.carry_out(move)
            return NoBody("a child's unwind")
        plan = self.record_child_reversal(move)
        self.follow(definition, parent.id, plan)
        if plan is None or move.outcome is not CompensationOutcome.FAILED:
            return NoBody("a child's unwind")
        what = (definition.name, record.name, record.compensation_attempts, move.reason or "")
        return Failed(attempt_failed("reversal of step", *what))

    def _run_first_delivery(
        self, saga_name: str, execution_id: str, step_name: str, attempt: int, version: str | None
    ) -> Outcome | None:
        # Only with the version the message names: this claim does not check it.
        definition = self.registry.known(saga_name, version) if version else None
        spec = definition.find_step(step_name) if definition else None
        if definition is None or spec is None or spec.compensation is None:
            return None
        lease = get_clock().now() + timedelta(seconds=self.settings.lease_seconds)
        held = ReversalAttempt(execution_id, step_name, attempt)
        claimed = reversal.claim_next_reversal(
            self.db, held, lease_expires_at=lease, with_run=reversal_needs_run(spec)
        )
        if claimed is None:
            return None
        record = next(s for s in claimed.steps if s.name == step_name)
        return self._run_reversal(definition, held, claimed, spec, record)

    def _reverse(
        self,
        definition: SagaDefinition,
        execution: ExecutionRecord,
        steps: list[StepRecord],
        spec: StepSpec,
        record: StepRecord,
    ) -> Outcome:
        lease = get_clock().now() + timedelta(seconds=self.settings.lease_seconds)
        held = ReversalAttempt(record.execution_id, record.name, record.compensation_attempts + 1)
        now = get_clock().now()
        if not unwind.claim_compensation(self.db, held, lease_expires_at=lease, now=now):
            return _refused(record.execution_id, record.name, "claimed elsewhere")
        claimed = replace(
            record, compensation_attempts=held.attempt, compensation_lease_expires_at=lease
        )
        steps = [claimed if s.id == record.id else s for s in steps]
        return self._run_reversal(definition, held, Unwinding(execution, steps), spec, claimed)

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
        renew = functools.partial(unwind.renew_compensation_lease, self.db, held)
        what = f"the reversal of step {record.name!r} of execution {execution_id}"
        stopped: BaseException | None = None
        with self.holding(lambda expiry: renew(lease_expires_at=expiry), what):
            try:
                ctx = reversal_context(self.db, definition, unwinding, record, key, attempt)
            except SQLAlchemyError:
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
        reason = describe_error(error)
        logger.log(
            logging.WARNING if attempt < spec.compensation_retry else logging.ERROR,
            "saga %r execution %s: reversal of step %r attempt %d failed: %s",
            definition.name,
            execution_id,
            held.name,
            attempt,
            reason,
            exc_info=error,
        )
        description = attempt_failed(
            "reversal of step", definition.name, held.name, attempt, reason
        )
        if attempt < spec.compensation_retry:
            if not unwind.release_compensation(self.db, held, reason=reason):
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

    # -- operator exits ------------------------------------------------------------------
    def resume(self, definition: SagaDefinition, execution_id: str) -> None:
        """Reopen a parked unwind, first the parked children it halted on (the reversal
        that failed runs again under its own key; the log line names it)."""
        unwind.require_stuck(self.db, execution_id, "resume_compensation")
        self.name_reruns(execution_id)
        for child in self.children.parked_children(execution_id, (CompensationOutcome.FAILED,)):
            self.resume(self.children.definition_of(child), child.id)
        self.carry_out(unwind_exits.reopen(self, definition, execution_id))

    def abandon(self, definition: SagaDefinition, execution_id: str) -> int:
        """Close a parked unwind for good, and the parked children it halted on."""
        unwind.require_stuck(self.db, execution_id, "abandon_compensation")
        owed = (None, CompensationOutcome.FAILED)
        for child in self.children.parked_children(execution_id, owed):
            self.abandon(self.children.definition_of(child), child.id)
        skipped = unwind_exits.close(self, definition, execution_id)
        self.settled(definition, execution_id)
        return skipped


def _refused(execution_id: str, step_name: str, why: str) -> NoBody:
    logger.info("reversal of %s/%s refused: %s", execution_id, step_name, why)
    return NoBody(why)
