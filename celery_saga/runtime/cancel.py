"""Cancelling a run (guarantee 31): store the cancel, stop what runs, unwind what ran.

``Cancellation.cancel`` decides (``decisions/cancel.py``), stores the cancel (first writer
wins against every forward write), asks the workers running the run's bodies to stop them
(Celery's revoke, which the body sees as its soft time limit), and returns the moves that
cancel the run's children first and begin the unwind once nothing of the run is still going.
A body that ends, or a child that ends, after the cancel comes back through
``resume_cancel``; the recovery sweep does too, for a cancel whose worker died halfway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_saga.decisions.cancel import (
    CANCELLABLE_STATES,
    CancelVerdict,
    bodies_in_flight,
    decide_cancel,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import VersionNotDeployedError
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.moves import (
    BeginUnwind,
    CancelChild,
    ContinueCancel,
    HandOn,
    Move,
    Stay,
    then,
)
from celery_saga.runtime.parts import Parts
from celery_saga.store import cancel, queries

logger = logging.getLogger("celery_saga")

#: The reason a run cancelled by its saga's deadline records.
DEADLINE = "deadline"


@dataclass(frozen=True)
class Cancellation:
    """Stores cancels and returns what each leads to."""

    parts: Parts

    def cancel(
        self, execution: ExecutionRecord, reason: str | None, actor: str | None = None
    ) -> tuple[CancelVerdict, Move]:
        """Cancel ``execution`` (as read; ``actor``: who asked, recorded in its history);
        returns what was done (see ``CancelVerdict``) and the moves that follow."""
        verdict = decide_cancel(execution)
        if verdict is not CancelVerdict.CANCEL:
            if execution.state is ExecutionState.CANCELLING:
                # stored already, perhaps by this very call retried after a lost reply: what
                # the cancel does next is done again (each part of it is safe to repeat)
                return verdict, self._carry_on(execution)
            return verdict, Stay()
        db, now = self.parts.db, get_clock().now()
        if execution.state is ExecutionState.QUEUED:
            return self._cancel_queued(execution, reason, actor)
        stored = cancel.request_cancel(
            db,
            execution_id=execution.id,
            reason=cancel.cancel_reason(reason),
            now=now,
            actor=actor,
        )
        if not stored:  # something moved it first: decide again on what it is now
            current = queries.load_execution(db, execution.id)
            if current is None:
                return CancelVerdict.ENDED, Stay()
            again = decide_cancel(current)
            return CancelVerdict.ENDED if again is CancelVerdict.CANCEL else again, Stay()
        logger.log(
            # the engine's own decision (a deadline) warns; a caller's cancel is news
            logging.WARNING if reason == DEADLINE else logging.INFO,
            "saga %r execution %s cancelled%s; its bodies in flight are stopped, then what "
            "it did is unwound",
            execution.saga_name,
            execution.id,
            f": {reason}" if reason else "",
        )
        self.parts.emit(
            "saga-cancelled",
            {"execution_id": execution.id, "saga": execution.saga_name, "reason": reason},
        )
        return CancelVerdict.CANCEL, self._carry_on(execution, actor)

    def _cancel_queued(
        self, execution: ExecutionRecord, reason: str | None, actor: str | None
    ) -> tuple[CancelVerdict, Move]:
        """A queued run ends ``cancelled`` and never starts; one started meanwhile (a run
        of its key ended) is cancelled as a running one."""
        db = self.parts.db
        why = cancel.cancel_reason(reason)
        now = get_clock().now()
        if not cancel.cancel_queued(
            db, execution_id=execution.id, reason=why, now=now, actor=actor
        ):
            current = queries.load_execution(db, execution.id)
            if current is None or current.state is ExecutionState.QUEUED:
                return CancelVerdict.ENDED, Stay()
            return self.cancel(current, reason, actor)
        logger.info(
            "saga %r execution %s cancelled while queued", execution.saga_name, execution.id
        )
        fields = {"execution_id": execution.id, "saga": execution.saga_name, "reason": reason}
        self.parts.emit("saga-cancelled", fields)
        return CancelVerdict.CANCEL, Stay()

    def _carry_on(self, execution: ExecutionRecord, actor: str | None = None) -> Move:
        """A stored cancel's next moves: stop the bodies (here), cancel the children, and
        begin the unwind if nothing of the run still goes."""
        steps = queries.load_snapshot(self.parts.db, execution.id)[1]
        self._stop_bodies(execution.id, steps)
        why = f"its parent {execution.id} was cancelled"
        children = [
            CancelChild(step.child_execution_id, why, actor)
            for step in steps
            if step.child_execution_id is not None
        ]
        try:
            definition = self.parts.definition_of(execution)
        except VersionNotDeployedError as missing:  # its unwind needs its own version
            return then(*children, HandOn(missing, execution.id, "cancel"))
        return then(*children, ContinueCancel(definition, execution.id))

    def cancel_child(self, child_id: str, reason: str, actor: str | None) -> Move:
        """Cancel a cancelled run's child if it still runs, waits or is queued (read now,
        as the cancel reaches it)."""
        child = queries.load_execution(self.parts.db, child_id)
        if child is None or child.state not in CANCELLABLE_STATES:
            return Stay()
        return self.cancel(child, reason, actor)[1]

    def resume_cancel(self, definition: SagaDefinition, execution_id: str) -> Move:
        """Begin the cancelled run's unwind if nothing of it is still going; nothing if
        something is (a body, a child), which comes back here when it ends."""
        begun = cancel.begin_cancelled_unwind(
            self.parts.db,
            execution_id=execution_id,
            compensations=definition.reversible,
            now=get_clock().now(),
        )
        if begun is None:
            return Stay()
        plan, reason = begun
        return BeginUnwind(definition, execution_id, plan, reason)

    def overdue(self, page: int = 200) -> list[str]:
        """The runs whose deadline has passed (for the timer sweep to cancel)."""
        return cancel.list_overdue(self.parts.db, now=get_clock().now(), limit=page)

    def not_cancelled(self, execution_id: str, verdict: CancelVerdict) -> None:
        """A run past its deadline that a cancel did not stop: its deadline is cleared."""
        logger.info(
            "execution %s: its deadline passed, but it is not cancelled (%s)",
            execution_id,
            verdict.value,
        )
        cancel.clear_deadline(self.parts.db, execution_id)

    def _stop_bodies(self, execution_id: str, steps: list[StepRecord]) -> None:
        for step in bodies_in_flight(steps, get_clock().now()):
            if step.holder is not None:
                logger.info(
                    "execution %s: stopping the body of step %r (%s)",
                    execution_id,
                    step.name,
                    step.holder,
                )
                self.parts.holders.stop(step.holder)
