"""Recording what a reversal did, through store outages (guarantees 2, 20).

A reversal that ran but whose outcome is not recorded is one the engine would run again.
So the outcome is retried for ``outcome_retry_budget`` seconds; only past that is the run
parked, with a reason saying the outcome is unknown, and only a park that was stored is
announced. A resume then re-runs that reversal under the same idempotency key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.lost_claims import MINE
from celery_saga.decisions.unwind import UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.records import Attempt, CompensationOutcome, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import RecordReversal
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.store import queries, recovery, reversal, unwind
from celery_saga.store.reversal import Unwinding
from celery_saga.store.transient import describe_store_error, retry_transient

logger = logging.getLogger("celery_saga")


@dataclass(frozen=True)
class ReversalOutcomes:
    """Writes a reversal's outcome and returns the unwind's next move as its record
    decided it."""

    parts: Parts

    def record_outcome(
        self,
        definition: SagaDefinition,
        held: Attempt,
        outcome: CompensationOutcome,
        reason: str | None,
        unwinding: Unwinding | None = None,
    ) -> UnwindStep | None:
        """Persist a reversal's outcome and return the unwind's next move (None: nothing
        for this worker to do, the claim was lost, or the run was parked). ``unwinding``:
        the run as the claim found it (read here if the caller has none)."""
        already: UnwindStep | None = None
        execution_id, name = held.execution_id, held.name
        try:
            return write_outcome(
                lambda: self._write_outcome(definition, held, outcome, reason, unwinding),
                budget=self.parts.settings.outcome_retry_budget,
                what=f"the outcome of the reversal of step {name!r} of execution {execution_id}",
                landed=lambda: self._landed(held, outcome),
                if_landed=already,
                restore=lambda: self.parts.lost_claims.reversal(held) in MINE,
            )
        except SQLAlchemyError as store_error:
            self._park_unknown(definition, execution_id, name, outcome, store_error)
            return None

    def _write_outcome(
        self,
        definition: SagaDefinition,
        held: Attempt,
        outcome: CompensationOutcome,
        reason: str | None,
        unwinding: Unwinding | None,
    ) -> UnwindStep | None:
        if unwinding is None:
            execution, steps = queries.load_snapshot(self.parts.db, held.execution_id)
            if execution is None:
                return None
            unwinding = Unwinding(execution, steps)
        return reversal.record_compensation(
            self.parts.db,
            held,
            outcome=outcome,
            reason=reason,
            compensations=definition.reversible,
            now=get_clock().now(),
            steps=unwinding.steps,
            committed=unwinding.committed,
            holds_slot=definition.concurrency is not None,
        )

    def lost_too_often(
        self, definition: SagaDefinition, unwinding: Unwinding, record: StepRecord
    ) -> UnwindStep | None:
        """A reversal whose attempts never finished (its worker died each time) halts the
        unwind after ``compensation_retry + 1`` of them, like one that kept failing;
        returns the unwind's next move (None: the claim was not ours to take)."""
        attempt = record.compensation_attempts
        reason = (
            f"WorkerLostError: attempt {attempt} of the reversal of step {record.name!r} "
            "never finished (its worker stopped) and no attempt is left"
        )
        now = get_clock().now()
        held = Attempt.reversal(record.execution_id, record.name, attempt + 1, now)
        # Take the lapsed claim over first: a holder that renewed its lease keeps it.
        lease = now + timedelta(seconds=self.parts.lease)
        claim = unwind.claim_compensation
        if not claim(self.parts.db, held, lease_expires_at=lease, now=now, previous=record):
            return None
        logger.warning("execution %s: %s", record.execution_id, reason)
        return self.record_outcome(definition, held, CompensationOutcome.FAILED, reason, unwinding)

    def record_child_reversal(self, move: RecordReversal) -> UnwindStep | None:
        """Record how a parent's reversal of its child ended; returns the next move."""
        record = move.record
        held = Attempt.reversal(move.execution_id, record.name, record.compensation_attempts)
        plan = self.record_outcome(move.definition, held, move.outcome, move.reason)
        if plan is None:
            return None
        fields = {
            "execution_id": move.execution_id,
            "saga": move.definition.name,
            "step": record.name,
        }
        if move.outcome is CompensationOutcome.COMPENSATED:
            self.parts.emit("saga-step-compensated", fields)
        else:
            self.parts.emit("saga-compensation-failed", {**fields, "error": move.reason})
        return plan

    def _landed(self, held: Attempt, outcome: CompensationOutcome) -> bool:
        record = queries.load_step(self.parts.db, held.execution_id, held.name)
        if record is None or record.compensation_status is not outcome:
            return False
        if record.compensation_attempts != held.attempt:
            return False
        # Ours committed, but the next move it decided is unknown here: the timer sweep
        # carries on with whatever the record says is next.
        now = get_clock().now()
        recovery.mark_message_owed(self.parts.db, execution_id=held.execution_id, now=now)
        return True

    def name_reruns(self, execution_id: str) -> None:
        """Log each reversal a resume runs again (failed, or outcome unknown) and its key."""
        _, steps = queries.load_snapshot(self.parts.db, execution_id)
        for record in steps:
            unsettled = record.compensation_status is None and record.compensation_attempts
            if record.compensation_status is CompensationOutcome.FAILED or unsettled:
                logger.warning(
                    "resume_compensation %s: the reversal of step %r runs again under the key %s",
                    execution_id,
                    record.name,
                    record_key(execution_id, record.name, "compensate"),
                )

    def _park_unknown(
        self,
        definition: SagaDefinition,
        execution_id: str,
        name: str,
        outcome: CompensationOutcome,
        store_error: SQLAlchemyError,
    ) -> None:
        key = record_key(execution_id, name, "compensate")
        why = (
            f"the outcome ({outcome.value}) of the reversal of step {name!r} could not be "
            f"recorded within {self.parts.settings.outcome_retry_budget:g} s "
            f"({describe_store_error(store_error)}); it is unknown to the store whether it "
            f"ran: resume_compensation runs it again under the key {key}"
        )
        try:
            parked = retry_transient(
                lambda: unwind.park_unwind(
                    self.parts.db, execution_id=execution_id, reason=why, now=get_clock().now()
                ),
                budget=self.parts.settings.outcome_retry_budget,
                what=f"parking execution {execution_id}",
            )
        except SQLAlchemyError as error:
            logger.error(
                "execution %s: %s; it could not be parked either (%s): its claim stays until "
                "its lease ends, then the reversal runs again under the key %s",
                execution_id,
                why,
                describe_store_error(error),
                key,
            )
            raise
        if not parked:
            return
        logger.warning(
            "execution %s of saga %r parked compensation_stuck: %s (to continue: "
            "celery saga resume %s)",
            execution_id,
            definition.name,
            why,
            execution_id,
        )
        self.parts.emit(
            "saga-compensation-stuck",
            {"execution_id": execution_id, "saga": definition.name, "step": name, "reason": why},
        )
