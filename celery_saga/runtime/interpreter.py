"""The one place a move is carried out.

Helpers (waits, sub-sagas, failures, cancels, the recovery sweep, the unwind's exits)
read and write what their decision needs and return a move (``runtime/moves.py``); here
each kind is matched once and done: the store write that follows it, its events, then the
publish. A write that decides a further move returns it, and that is carried out in turn.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError

from celery_saga.records import ExecutionState
from celery_saga.runtime import forward_moves, unwind_moves
from celery_saga.runtime.cancel import Cancellation
from celery_saga.runtime.child_unwind import ChildUnwind
from celery_saga.runtime.moves import (
    Announce,
    BeginUnwind,
    CancelChild,
    CompleteStep,
    ContinueCancel,
    FailRun,
    FailStep,
    FollowUnwind,
    HandOn,
    Move,
    MoveOn,
    Moves,
    PublishNode,
    PublishPosition,
    PublishReversal,
    RecordReversal,
    Refuse,
    Settled,
    StartChild,
    StartQueued,
    Stay,
    unreachable,
)
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.reversal_outcome import ReversalOutcomes
from celery_saga.runtime.step_outcomes import StepOutcomes
from celery_saga.tracing.carry import carried

logger = logging.getLogger("celery_saga")


class Interpreter:
    """Carries moves out, over the runtime's parts and the helpers whose writes a move
    names (a step's outcome, a reversal's, a cancel's, a child's unwind)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.steps = StepOutcomes(parts)
        self.reversals = ReversalOutcomes(parts)
        self.children = ChildUnwind(parts)
        self.cancellation = Cancellation(parts)

    def carry_out(self, move: Move) -> None:
        """Do what a helper decided, and what that leads to."""
        parts = self.parts
        # A match tries its cases in turn: the ones a step's or a reversal's message meets
        # come first (publish the next, announce, follow the unwind), the rare ones last.
        match move:
            case PublishPosition(definition, execution_id, node, sub):
                messages = forward_moves.position_messages(
                    parts, definition, execution_id, node, sub
                )
                self.carry_out(messages)
            case PublishNode():
                self._publish_node(move)
            case Announce(event, fields):
                parts.emit(event, fields)
            case PublishReversal():
                self._publish_reversal(move)
            case FollowUnwind(definition, execution_id, plan):
                self.carry_out(unwind_moves.follow(parts, definition, execution_id, plan))
            case StartQueued(definition, execution_id, node, sub, trace, freed_by):
                run = (definition.name, definition.hash, execution_id)
                with parts.tracer.admission(run, freed_by, trace):
                    self.carry_out(PublishPosition(definition, execution_id, node, sub))
            case Settled(definition, execution_id):
                if parts.registry.may_be_child(definition.name):
                    self.carry_out(self.children.notify_parent(execution_id))
                if definition.concurrency is not None:
                    self.carry_out(forward_moves.handed_on(parts, definition, execution_id))
            case MoveOn(definition, execution_id, onward):
                self.carry_out(forward_moves.advanced(parts, definition, execution_id, onward))
            case Moves(moves):
                for each in moves:
                    self.carry_out(each)
            case BeginUnwind(definition, execution_id, plan, reason, at):
                self.carry_out(
                    unwind_moves.begin(parts, definition, execution_id, plan, reason, at)
                )
            case Stay():
                pass
            case CompleteStep(definition, step, blob, onward, fields):
                self.carry_out(
                    self.steps.completed(definition, step, blob, onward, fields) or Stay()
                )
            case RecordReversal(definition, execution_id):
                plan = self.reversals.record_child_reversal(move)
                self.carry_out(FollowUnwind(definition, execution_id, plan))
            case FailStep():
                self.carry_out(self.steps.child_failed(move))
            case FailRun(definition, execution_id, reason, at):
                self.carry_out(self.steps.fail_run(definition, execution_id, reason, at))
            case StartChild():
                self._start_child(move)
            case Refuse(message, verdict):
                forward_moves.refused(parts, message, verdict.value)
            case ContinueCancel(definition, execution_id):
                self.carry_out(self.cancellation.resume_cancel(definition, execution_id))
            case CancelChild(execution_id, reason, actor):
                self.carry_out(self.cancellation.cancel_child(execution_id, reason, actor))
            case HandOn(missing, execution_id, command):
                parts.publisher.hand_on(missing, execution_id, command)
            case _:
                unreachable(move)

    def _publish_node(self, move: PublishNode) -> None:
        definition = move.definition
        self.parts.publisher.publish_node(
            definition.name,
            move.spec,
            move.message,
            countdown=move.countdown,
            label=move.label,
            version=definition.hash,
        )

    def _publish_reversal(self, move: PublishReversal) -> None:
        definition, name = move.definition, move.name
        self.parts.publisher.publish_compensation(
            definition.name,
            definition.find_step(name),
            move.execution_id,
            name,
            move.attempt,
            move.countdown,
            version=definition.hash,
        )

    def _start_child(self, move: StartChild) -> None:
        """Store and launch a sub-saga's run: its root span a child span in its parent's
        trace (the one the parent's message carries). A child queued by its flow-control
        limit is launched by the run of its key that ends."""
        parts, definition = self.parts, move.definition
        child = (definition.name, definition.hash, move.child_id)
        with parts.tracer.run(*child, parent_trace=carried()) as trace:
            try:
                state = forward_moves.create(
                    parts,
                    definition,
                    move.child_input,
                    move.child_id,
                    parent_execution_id=move.parent_id,
                    trace_context=trace,
                )
            except IntegrityError:
                adopted = (move.parent_id, move.child_id)
                logger.info("execution %s adopts its existing child %s", *adopted)
                return
            if state is ExecutionState.QUEUED:
                parts.tracer.queued()
                return
            launch = forward_moves.launch(parts, definition, move.child_id, move.parent_id)
            self.carry_out(launch)
