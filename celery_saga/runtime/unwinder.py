"""The unwind's messages: one reversal per message, in reverse start order, halting on
the first definitive failure (guarantees 1-9, 20); and the operator's exits from a
parked unwind."""

from __future__ import annotations

import logging
from datetime import datetime

from celery_saga.decisions.admission import Admission
from celery_saga.decisions.takeover import Answer, Takeover
from celery_saga.decisions.unwind import (
    UnwindKind,
    UnwindStep,
    compensation_admission,
    next_unwind_step,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.records import (
    Attempt,
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
)
from celery_saga.runtime import unwind_exits
from celery_saga.runtime.attempt import run_and_carry_out
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.holders import HeldClaim
from celery_saga.runtime.interpreter import Interpreter
from celery_saga.runtime.invoke import reversal_needs_run
from celery_saga.runtime.moves import FollowUnwind, PublishReversal, RecordReversal
from celery_saga.runtime.outcomes import (
    Failed,
    NoBody,
    Outcome,
    attempt_failed,
)
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.reversal_runs import ReversalSide, claim_after, claim_next
from celery_saga.runtime.takeovers import judge, taken_over
from celery_saga.store import operator_exits, queries, unwind
from celery_saga.store.reversal import Unwinding

logger = logging.getLogger("celery_saga")


class Unwinder:
    """Admits and routes compensate messages and the operator's exits from a parked
    unwind; what they lead to is carried out by the interpreter."""

    def __init__(self, parts: Parts, interpreter: Interpreter) -> None:
        self.parts, self.interpreter = parts, interpreter
        self.carry_out = interpreter.carry_out
        self.children, self.outcomes = interpreter.children, interpreter.reversals

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

        Fast path (first delivery, on a store with that claim: PostgreSQL, SQLite): claim at
        once, the claim's WHERE clause being the admission rule, and take the run from the
        claim.
        Anything else, or a refused claim, reads the run and lets ``compensation_admission``
        decide.
        """
        if saga_name is not None and not redelivered:
            outcome = self._run_first_delivery(saga_name, execution_id, step_name, attempt, version)
            if outcome is not None:
                return outcome
        now = get_clock().now()
        execution, steps = queries.load_snapshot(self.parts.db, execution_id)
        if execution is None or execution.state is not ExecutionState.COMPENSATING:
            return _refused(execution_id, step_name, "run is not compensating")
        # Compensations of the run's own version only; without it the message goes back.
        definition = self.parts.definition_of(execution)
        compensations = definition.reversible
        planned = next_unwind_step(steps, execution.committed_at is not None, compensations)
        if planned.kind is not UnwindKind.COMPENSATE:
            plan = unwind.plan_unwind(
                self.parts.db, execution_id=execution_id, compensations=compensations, now=now
            )
            self.carry_out(FollowUnwind(definition, execution_id, plan))
            return NoBody("the unwind has no reversal to run here")
        record = next((s for s in steps if s.name == step_name), None)
        if planned.record is not None and planned.record.child_execution_id is not None:
            if record is None or record.id != planned.record.id:
                return _refused(execution_id, step_name, "not next")
            return self._reverse_child(definition, execution, planned.record)
        asked = Attempt.reversal(execution_id, step_name, attempt)
        unwinding = Unwinding(execution, steps)
        return self._admit(definition, unwinding, planned, record, asked, redelivered)

    def _admit(
        self,
        definition: SagaDefinition,
        unwinding: Unwinding,
        planned: UnwindStep,
        record: StepRecord | None,
        message: Attempt,
        redelivered: bool,
    ) -> Outcome:
        """Admit the reversal ``message`` names by the run as read (``planned``: the
        unwind's next move): a claim in flight is left to a live holder, or taken over."""
        now = get_clock().now()
        execution, steps = unwinding.run, unwinding.steps
        assert execution is not None
        execution_id, step_name, attempt = message.execution_id, message.name, message.attempt
        lease = record.compensation_lease_expires_at if record else None
        live = lease is not None and lease > now
        verdict = compensation_admission(record, planned, attempt, live)
        retake = verdict is Admission.REJECT_IN_FLIGHT and redelivered
        if record is None or not (verdict is Admission.RUN or retake):
            return _refused(execution_id, step_name, verdict.value)
        spec = definition.find_step(step_name)
        assert spec is not None and spec.compensation is not None
        takeover, asked = Takeover.TAKE_OVER, None
        if lease is not None:
            claim = HeldClaim(
                "reversal",
                execution_id,
                step_name,
                record.compensation_attempts,
                record.compensation_holder,
                lease_live=live,
            )
            takeover, answer = judge(self.parts.holders, claim)
            if takeover is Takeover.LEAVE:
                again = Attempt.reversal(execution_id, step_name, attempt)
                return self._left_to_holder(definition, again, redelivered, lease, live)
            asked = (claim, answer)
        lost = takeover is Takeover.TAKE_OVER and lease is not None
        if lost and record.compensation_attempts > spec.compensation_retry:
            plan = self.outcomes.lost_too_often(definition, unwinding, record)
            self.carry_out(FollowUnwind(definition, execution_id, plan))
            return NoBody("no attempt left after lost ones")
        seen = lease if live else None
        return self._reverse(definition, execution, steps, spec, record, seen, asked)

    def _left_to_holder(
        self,
        definition: SagaDefinition,
        again: Attempt,
        redelivered: bool,
        lease: datetime,
        live: bool,
    ) -> Outcome:
        """The holder still runs the reversal: a redelivered message waits for its claim."""
        if not redelivered:
            return _refused(again.execution_id, again.name, Admission.REJECT_IN_FLIGHT.value)
        wait = self.parts.until_released(lease, live)
        self.carry_out(
            PublishReversal(definition, again.execution_id, again.name, again.attempt, wait)
        )
        return NoBody("held back while the attempt in flight holds its claim")

    def _reverse_child(
        self, definition: SagaDefinition, parent: ExecutionRecord, record: StepRecord
    ) -> Outcome:
        """The parent's unwind reached its record of a child: a reversal that failed (the
        child cannot be cleanly unwound) ends its task as failed, as any reversal does."""
        move = self.children.reverse(definition, parent, record)
        if not isinstance(move, RecordReversal):
            self.carry_out(move)
            return NoBody("a child's unwind")
        plan = self.outcomes.record_child_reversal(move)
        self.carry_out(FollowUnwind(definition, parent.id, plan))
        if plan is None or move.outcome is not CompensationOutcome.FAILED:
            return NoBody("a child's unwind")
        what = (definition.name, record.name, record.compensation_attempts, move.reason or "")
        return Failed(attempt_failed("reversal of step", *what))

    def _run_first_delivery(
        self, saga_name: str, execution_id: str, step_name: str, attempt: int, version: str | None
    ) -> Outcome | None:
        # Only with the version the message names: this claim does not check it.
        definition = self.parts.registry.known(saga_name, version) if version else None
        spec = definition.find_step(step_name) if definition else None
        if definition is None or spec is None or spec.compensation is None:
            return None
        held = Attempt.reversal(execution_id, step_name, attempt)
        claimed = claim_next(self.parts, held, reversal_needs_run(spec))
        if claimed is None:
            return None
        held, unwinding = claimed
        record = next(s for s in unwinding.steps if s.name == step_name)
        return self._run(definition, held, unwinding, spec, record)

    def _reverse(
        self,
        definition: SagaDefinition,
        execution: ExecutionRecord,
        steps: list[StepRecord],
        spec: StepSpec,
        record: StepRecord,
        seen_lease: datetime | None = None,
        asked: tuple[HeldClaim, Answer] | None = None,
    ) -> Outcome:
        claimed = claim_after(self.parts, Unwinding(execution, steps), record, seen_lease)
        if claimed is None:
            return _refused(record.execution_id, record.name, "claimed elsewhere")
        if asked is not None:
            taken_over(*asked)
        held, unwinding, record = claimed
        return self._run(definition, held, unwinding, spec, record)

    def _run(
        self,
        definition: SagaDefinition,
        held: Attempt,
        unwinding: Unwinding,
        spec: StepSpec,
        record: StepRecord,
    ) -> Outcome:
        """Run the reversal this worker claimed (``held``; ``record`` as claimed)."""
        run = ReversalSide(self.parts, self.outcomes, definition, held, unwinding, spec, record)
        self.parts.emit("saga-compensation-started", run.fields)
        return run_and_carry_out(self.parts, run, self.carry_out)

    # -- operator exits ------------------------------------------------------------------
    def resume(
        self, definition: SagaDefinition, execution_id: str, actor: str | None = None
    ) -> None:
        """Reopen a parked unwind, first the parked children it halted on (the reversal
        that failed runs again under its own key; the log line names it)."""
        operator_exits.require_stuck(self.parts.db, execution_id, "resume_compensation")
        self.outcomes.name_reruns(execution_id)
        for child in self.children.parked_children(execution_id, (CompensationOutcome.FAILED,)):
            self.resume(self.parts.definition_of(child), child.id, actor)
        self.carry_out(unwind_exits.reopen(self.parts, definition, execution_id, actor))

    def resolve(
        self,
        definition: SagaDefinition,
        execution_id: str,
        resolved: tuple[str, str],
        actor: str | None = None,
    ) -> None:
        """Go on past the parked reversal of ``resolved[0]``, done by hand (note
        ``resolved[1]``): the unwind continues with the next step."""
        # Checked in the resolve's own transaction: a retry of a resolve whose reply was
        # lost finds it stored, not a run that is no longer parked.
        move = unwind_exits.go_on_by_hand(self.parts, definition, execution_id, resolved, actor)
        self.carry_out(move)

    def abandon(
        self,
        definition: SagaDefinition,
        execution_id: str,
        actor: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Close a parked unwind for good, and the parked children it halted on."""
        operator_exits.require_stuck(self.parts.db, execution_id, "abandon_compensation")
        owed = (None, CompensationOutcome.FAILED)
        for child in self.children.parked_children(execution_id, owed):
            self.abandon(self.parts.definition_of(child), child.id, actor, reason)
        skipped, move = unwind_exits.close(self.parts, definition, execution_id, actor, reason)
        self.carry_out(move)
        return skipped


def _refused(execution_id: str, step_name: str, why: str) -> NoBody:
    logger.info("reversal of %s/%s refused: %s", execution_id, step_name, why)
    return NoBody(why)
