"""Recording how a step ended, through store outages (guarantee 20): completed (a
parallel member joins its group first), failed for good, or lost too often; and failing a
run for a reason no step raised. Each write returns the move it decided (move on, begin
the unwind, carry a cancel on) for ``Interpreter.carry_out``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindKind, UnwindStep
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode
from celery_saga.records import Attempt, ExecutionState, StepRecord, StepStatus
from celery_saga.redaction import scrub
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.holds import Holds
from celery_saga.runtime.moves import (
    Announce,
    BeginUnwind,
    ContinueCancel,
    FailStep,
    Move,
    MoveOn,
    Stay,
    then,
)
from celery_saga.runtime.navigation import Position, next_position
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.scrubbing import failure_secrets
from celery_saga.store import claims, forward, joins, queries, recovery, step_failure
from celery_saga.store.forward import GroupResult

logger = logging.getLogger("celery_saga")


@dataclass(frozen=True)
class StepOutcomes:
    """Writes a step's outcome and returns what the write decided."""

    parts: Parts

    def landed(self, step: Attempt, status: StepStatus) -> bool:
        """Whether an earlier try of this attempt's outcome write committed: asked before
        retrying a write whose reply was lost with its connection."""
        record = queries.load_step(self.parts.db, step.execution_id, step.name)
        if record is None or record.status is not status or record.attempts != step.attempt:
            return False
        return step.holder is None or record.holder == step.holder

    def completed(
        self,
        definition: SagaDefinition,
        step: Attempt,
        blob: bytes,
        onward: Advance,
        fields: dict[str, Any],
    ) -> Move | None:
        """Record ``step`` completed and move the run on (a parallel member: join first);
        None: the claim was no longer ours, nothing was recorded. The result exists only
        in this process: its record is retried through store outages (guarantee 20) rather
        than left to a lease that would run the body again."""
        parts = self.parts
        target = definition.nodes[step.node]
        if not isinstance(target, ParallelNode):
            if not parts.write_step_outcome(
                definition,
                step,
                lambda: forward.record_step_completed(
                    parts.db, step, result_blob=blob, advance=onward, now=get_clock().now()
                ),
                what=f"the result of step {step.name!r} of execution {step.execution_id}",
                landed=lambda: self.landed(step, StepStatus.COMPLETED),
                if_landed=True,
            ):
                return None
            parts.emit("saga-step-completed", fields)
            return MoveOn(definition, step.execution_id, onward)
        members = [s.name for s in target.steps]
        group = self.settle(definition, step, members, onward, result_blob=blob)
        if group is None:
            return None
        parts.emit("saga-step-completed", fields)
        return _group_move(definition, step.execution_id, group, onward)

    def rejoin(self, definition: SagaDefinition, message: NodeMessage) -> Move:
        """A settled member's message came again while its run stands at the group: join the
        group if every member has settled (``joins.join_if_settled``), as its last member
        would have."""
        target = definition.nodes[message.node]
        assert isinstance(target, ParallelNode)
        name = target.steps[message.member].name
        step = Attempt(message.execution_id, name, message.node, message.sub, 0)
        onward = next_position(definition, message.node, message.sub, 1)
        group = joins.join_if_settled(
            self.parts.db,
            step,
            group=target.name,
            members=[s.name for s in target.steps],
            compensations=definition.reversible,
            now=get_clock().now(),
            advance=onward,
        )
        if group is None or not group.settled:
            return Stay()
        logger.warning("execution %s: group %r joined late", message.execution_id, target.name)
        return _group_move(definition, step.execution_id, group, onward)

    def settle(
        self,
        definition: SagaDefinition,
        step: Attempt,
        members: list[str],
        onward: Advance,
        *,
        result_blob: bytes | None = None,
        error: str | None = None,
        cause: BaseException | None = None,
    ) -> GroupResult | None:
        """Record a parallel member's result or a step's final failure, retried through
        store outages; the last member to settle decides for the node (guarantee 20)."""
        parts = self.parts
        status = StepStatus.FAILED if error is not None else StepStatus.COMPLETED

        def landed() -> bool:
            if not self.landed(step, status):
                return False
            # Ours committed but what it decided is unknown here: the timer sweep sends
            # whatever the run's record says is next.
            recovery.mark_message_owed(
                parts.db, execution_id=step.execution_id, now=get_clock().now()
            )
            return True

        def record() -> GroupResult | None:
            fields: dict[str, Any] = {
                "members": members,
                "advance": onward,
                "compensations": definition.reversible,
                "now": get_clock().now(),
            }
            if error is not None:
                return step_failure.record_step_failed(parts.db, step, error=error, **fields)
            return joins.record_step_settled(parts.db, step, result_blob=result_blob, **fields)

        unknown: GroupResult | None = GroupResult(settled=False)
        result = parts.write_step_outcome(
            definition,
            step,
            record,
            what=f"the outcome of step {step.name!r} of execution {step.execution_id}",
            landed=landed,
            if_landed=unknown,
            cause=cause,
        )
        return self._ended_by_us(step.execution_id) if result is unknown else result

    def _ended_by_us(self, execution_id: str) -> GroupResult:
        """After a lost reply: when the write that landed ended the run (failed with nothing
        to reverse, or completed), its end is announced here, to monitors and to a parent
        run, as the write's own caller would have; the sweep carries on any other run. (No
        one else moves the run meanwhile: its next message is owed, not sent.)"""
        execution = queries.load_execution(self.parts.db, execution_id)
        if execution is not None and execution.state is ExecutionState.COMPLETED:
            return GroupResult(settled=True)
        if execution is None or execution.state is not ExecutionState.FAILED:
            return GroupResult(settled=False)
        done = UnwindStep(UnwindKind.DONE, rollback_status=execution.rollback_status)
        return GroupResult(settled=True, failure_reason=execution.failure_reason, unwind=done)

    def failed(
        self,
        definition: SagaDefinition,
        step: Attempt,
        reason: str,
        error: BaseException | None,
    ) -> Move:
        """Record ``step`` failed for good; the last member to settle fails the run and
        begins its unwind, or, a step whose policy is ``hold``, holds the run. A store that
        stays unreachable re-raises ``error``."""
        held = Holds(self.parts).hold(definition, step, reason, error)
        if held is not None:
            if isinstance(held, Stay):  # not live at the step: a cancel came first
                return self.ended_while_cancelling(step) or held
            return held
        stay = Advance(step.node, step.sub, False, False)
        members = members_of(definition, step)
        group = self.settle(definition, step, members, stay, error=reason, cause=error)
        if group is None:
            return self.ended_while_cancelling(step) or Stay()
        if group.settled and group.unwind is not None:
            return BeginUnwind(definition, step.execution_id, group.unwind, group.failure_reason)
        return Stay()

    def child_failed(self, move: FailStep) -> Move:
        """A child failed: its parent's record of it fails for good (the child's failure
        text, scrubbed by the child's markings, and by the parent's here)."""
        definition, step = move.definition, move.step
        secrets = failure_secrets(self.parts.db, definition, step.execution_id, self.parts.registry)
        reason = scrub(move.reason, secrets)
        fields = {
            "execution_id": step.execution_id,
            "saga": definition.name,
            "step": step.name,
            "attempt": step.attempt,
            "error": reason,
        }
        return then(
            self.failed(definition, step, reason, None), Announce("saga-step-failed", fields)
        )

    def exhausted(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        record: StepRecord | None,
        claim: Callable[[], int | None],
    ) -> Move | None:
        """An attempt that never settled (its worker died, or it ran past its lease) counts
        like one that raised: after ``retry + 1`` executions the step fails instead of being
        run again (guarantee 27). The lapsed claim is taken over first (a compare-and-set
        on the lease read), so a holder that renewed its lease meanwhile keeps its step.
        None: attempts are left."""
        spec = position.spec
        if record is None or spec is None or record.status is not StepStatus.RUNNING:
            return None
        # ``retry`` attempts may fail by raising; one lost attempt more is allowed, so a
        # crash never costs a step with ``retry=1`` its only run (guarantee 27: retry + 1).
        if record.attempts <= spec.retry:
            return None
        reason = (
            f"WorkerLostError: attempt {record.attempts} of step {record.name!r} never "
            "finished (its worker stopped, or it outlived its lease) and no attempt is left"
        )
        taken = claim()
        if taken is None:
            logger.info("execution %s: step %r is held again", message.execution_id, record.name)
            return Stay()
        logger.warning("saga %r execution %s: %s", definition.name, message.execution_id, reason)
        now, me = get_clock().now(), self.parts.holders.me()
        step = Attempt(
            message.execution_id, position.record_name, message.node, message.sub, taken, now, me
        )
        return self.failed(definition, step, reason, None)

    def ended_while_cancelling(self, step: Attempt) -> Move | None:
        """An attempt's outcome met a run being cancelled (or, for a stopped body, will):
        give its claim up and let the cancel go on; None if the run is not cancelling."""
        db = self.parts.db
        execution = queries.load_execution(db, step.execution_id)
        if execution is None or execution.state is not ExecutionState.CANCELLING:
            return None
        claims.give_up(db, step, now=get_clock().now(), why="it ended after the run's cancel")
        logger.info(
            "execution %s: step %r attempt %d ended after the run's cancel; not recorded",
            step.execution_id,
            step.name,
            step.attempt,
        )
        return ContinueCancel(self.parts.definition_of(execution), execution.id)

    def fail_run(
        self,
        definition: SagaDefinition,
        execution_id: str,
        reason: str,
        at: tuple[int, int] | None = None,
    ) -> Move:
        """Fail a live run for a reason no step raised (a choice that could not be made, a
        changed definition) and begin its unwind; ``at``: the (node, sub) it was found at,
        which the ``saga-forward-failed`` event carries."""
        db = self.parts.db
        reason = scrub(reason, failure_secrets(db, definition, execution_id, self.parts.registry))
        plan = forward.fail_execution(
            db,
            execution_id=execution_id,
            reason=reason,
            compensations=definition.reversible,
            now=get_clock().now(),
        )
        if plan is None:
            logger.info(
                "execution %s not failed now (%s): not live, or a step is in flight",
                execution_id,
                reason,
            )
            return Stay()
        return BeginUnwind(definition, execution_id, plan, reason, at)


def _group_move(
    definition: SagaDefinition, execution_id: str, group: GroupResult, onward: Advance
) -> Move:
    """What a settled write decided for the node: nothing yet (members still run), the
    unwind, or the move onward."""
    if not group.settled:
        return Stay()
    if group.unwind is not None:
        return BeginUnwind(definition, execution_id, group.unwind, group.failure_reason)
    return MoveOn(definition, execution_id, onward)


def members_of(definition: SagaDefinition, step: Attempt) -> list[str]:
    """The records that settle the node together: a parallel group's, or just this one."""
    target = definition.nodes[step.node]
    return [s.name for s in target.steps] if isinstance(target, ParallelNode) else [step.name]
