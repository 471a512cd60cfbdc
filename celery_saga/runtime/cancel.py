"""Cancelling a run (guarantee 31): store the cancel, stop what runs, unwind what ran.

``Cancellation.cancel`` decides (``decisions/cancel.py``), stores the cancel (first writer
wins against every forward write), asks the workers running the run's bodies to stop them
(Celery's revoke, which the body sees as its soft time limit), cancels the run's children
first, and begins the unwind once nothing of the run is still going. A body that ends, or
a child that ends, after the cancel comes back through ``resume_cancel``; the recovery sweep
does too, for a cancel whose worker died halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery_saga.decisions.cancel import CancelVerdict, bodies_in_flight, decide_cancel
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import VersionNotDeployedError
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.ports import RuntimeParts
from celery_saga.store import cancel, queries

logger = logging.getLogger("celery_saga")

#: The reason a run cancelled by its saga's deadline records.
DEADLINE = "deadline"

#: ``begin(definition, execution_id, plan, reason)``: the unwinder's first move.
BeginUnwind = Callable[..., None]
#: The definition a run runs on (its own version).
DefinitionOf = Callable[[ExecutionRecord], SagaDefinition]


class Cancellation:
    def __init__(self, parts: RuntimeParts, begin: BeginUnwind, definition_of: DefinitionOf):
        self.parts, self.begin, self.definition_of = parts, begin, definition_of

    def cancel(
        self, execution: ExecutionRecord, reason: str | None, actor: str | None = None
    ) -> CancelVerdict:
        """Cancel ``execution`` (as read; ``actor``: who asked, recorded in its history);
        returns what was done (see ``CancelVerdict``)."""
        verdict = decide_cancel(execution)
        if execution.state is ExecutionState.CANCELLING:
            # stored already, perhaps by this very call retried after a lost reply: what
            # the cancel does next is done again (each part of it is safe to repeat)
            self._carry_on(execution)
        if verdict is not CancelVerdict.CANCEL:
            return verdict
        db, now = self.parts.db, get_clock().now()
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
                return CancelVerdict.ENDED
            again = decide_cancel(current)
            return CancelVerdict.ENDED if again is CancelVerdict.CANCEL else again
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
        self._carry_on(execution, actor)
        return CancelVerdict.CANCEL

    def _carry_on(self, execution: ExecutionRecord, actor: str | None = None) -> None:
        """A stored cancel's next moves: stop the bodies, cancel the children, and begin
        the unwind if nothing of the run still goes."""
        steps = queries.load_snapshot(self.parts.db, execution.id)[1]
        self._stop_bodies(execution.id, steps)
        self._cancel_children(execution.id, steps, actor)
        try:
            definition = self.definition_of(execution)
        except VersionNotDeployedError as missing:  # its unwind needs its own version
            self.parts.publisher.hand_on(missing, execution.id, "cancel")
            return
        self.resume_cancel(definition, execution.id)

    def resume_cancel(self, definition: SagaDefinition, execution_id: str) -> bool:
        """Begin the cancelled run's unwind if nothing of it is still going; False if
        something is (a body, a child), which comes back here when it ends."""
        begun = cancel.begin_cancelled_unwind(
            self.parts.db,
            execution_id=execution_id,
            compensations=definition.reversible,
            now=get_clock().now(),
        )
        if begun is None:
            return False
        plan, reason = begun
        self.begin(definition, execution_id, plan, reason)
        return True

    def cancel_overdue(self, page: int = 200) -> int:
        """Cancel every run whose deadline has passed (the timer sweep); returns how many."""
        db, acted = self.parts.db, 0
        for execution_id in cancel.list_overdue(db, now=get_clock().now(), limit=page):
            execution = queries.load_execution(db, execution_id)
            if execution is None:
                continue
            verdict = self.cancel(execution, DEADLINE)
            if verdict is CancelVerdict.CANCEL:
                acted += 1
                continue
            logger.info(
                "execution %s: its deadline passed, but it is not cancelled (%s)",
                execution_id,
                verdict.value,
            )
            cancel.clear_deadline(db, execution_id)
        return acted

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

    def _cancel_children(
        self, execution_id: str, steps: list[StepRecord], actor: str | None
    ) -> None:
        for step in steps:
            if step.child_execution_id is None:
                continue
            child = queries.load_execution(self.parts.db, step.child_execution_id)
            if child is not None and child.state in (
                ExecutionState.RUNNING,
                ExecutionState.WAITING,
            ):
                self.cancel(child, f"its parent {execution_id} was cancelled", actor)
