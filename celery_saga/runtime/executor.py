"""Forward execution of one node message: admit it, route it (a gate, a sub-saga, a step,
a position with nothing to run), and hand what follows to the interpreter; every rule it
follows lives in ``decisions/``. The engine's calls on runs (start, signal, cancel, the
timer sweeps) are ``EngineCalls``'s, reached through the executor."""

from __future__ import annotations

import logging

from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.takeover import Takeover
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode, StepNode, SubSagaNode, WaitNode
from celery_saga.errors import BranchPathError, LoopError, PayloadError
from celery_saga.records import (
    Attempt,
    Direction,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
    StepStatus,
)
from celery_saga.runtime import forward_moves
from celery_saga.runtime.attempt import run_and_carry_out
from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.children import Children
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context_builder import Snapshot
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.engine_calls import EngineCalls
from celery_saga.runtime.holders import HeldClaim, Holders
from celery_saga.runtime.interpreter import Interpreter
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import FailRun, FailStep, PublishNode
from celery_saga.runtime.navigation import Position, node_at, record_at, resolve, route
from celery_saga.runtime.outcomes import Failed, NoBody, Outcome, attempt_failed
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.ports import EventSink, Publisher, Settings
from celery_saga.runtime.step_attempt import StepSide, claim_step
from celery_saga.runtime.step_flow import DoorAnswer, StepFlow, is_limited
from celery_saga.runtime.takeovers import judge, taken_over
from celery_saga.runtime.unwinder import Unwinder
from celery_saga.runtime.waits import Waits
from celery_saga.store import queries
from celery_saga.store.database import Database
from celery_saga.store.step_flow import StepDoor
from celery_saga.tracing.carry import adopt, carried
from celery_saga.tracing.spans import AttemptSpan

logger = logging.getLogger("celery_saga")

#: Admissions of a message that meets a claim in flight: a live one, or a lapsed one.
_CLAIMED = (Admission.REJECT_IN_FLIGHT, Admission.RUN)
#: What a control-flow choice raises when it cannot be made: the run fails, unwound.
CHOICE_ERRORS = (BranchPathError, LoopError, PayloadError)


class Executor:
    """Admits and routes forward messages and the engine's calls on runs; what they lead
    to is carried out by the interpreter, the unwind's messages by the unwinder."""

    def __init__(
        self,
        db: Database,
        registry: Catalog,
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
        holders: Holders | None = None,
    ) -> None:
        held = Holders() if holders is None else holders
        self.parts = parts = Parts(db, registry, publisher, emit, settings, held)
        self.interpreter = Interpreter(parts)
        self.carry_out = self.interpreter.carry_out
        self.unwinder = Unwinder(parts, self.interpreter)
        self.waits, self.children = Waits(parts), Children(parts)
        self.step_flow = StepFlow(parts)
        # Views of the parts that the worker reads (the parts themselves are frozen).
        self.holders = parts.holders
        self.lost_claims, self.renewals = parts.lost_claims, parts.renewals
        # The engine's calls on runs, carried out through the same interpreter.
        calls = EngineCalls(parts, self.interpreter, self.waits)
        self.create, self.launch, self.signalled = calls.create, calls.launch, calls.signalled
        self.cancel, self.continue_cancel = calls.cancel, calls.continue_cancel
        self.fire_timers, self.cancel_overdue = calls.fire_timers, calls.cancel_overdue
        self.move_held, self.unwind_expired_holds = calls.move_held, calls.unwind_expired_holds
        self.pauses, self.release_paused = calls.pauses, calls.release_paused
        self.expire_hold = calls.expire_hold

    @property
    def publisher(self) -> Publisher:
        """The parts' publisher (read-only: the parts are one value every part shares)."""
        return self.parts.publisher

    # -- running a node ---------------------------------------------------------------
    def run_node(
        self,
        message: NodeMessage,
        saga_name: str | None = None,
        redelivered: bool = False,
        version: str | None = None,
    ) -> Outcome:
        """Handle one node message (of a run on ``version``, when the message names it).

        Fast path (first delivery of a first attempt of a plain or parallel step): claim
        straight away; the claim's WHERE clause is the admission predicate (live run, this
        position, the run's own version, no START record yet). Anything else, or a refused
        claim, takes the checked path: read the run and let ``decide_admission`` say what to
        do. A run whose version this process lacks raises ``VersionNotDeployedError`` there,
        before anything is claimed: the worker hands the message back.
        """
        known = self.parts.registry.known
        definition = known(saga_name, version) if saga_name and version else None
        if definition is not None and message.attempt == 1 and not redelivered:
            target = node_at(definition, message)
            routed = isinstance(target, (StepNode, ParallelNode))
            spec = route(target, 0, message.member) if routed and target else None
            if spec is not None and not is_limited(spec):  # a limited step passes its door
                position, holder = Position(spec, spec.name), self.parts.holders.me()
                span = self._span(definition, position, message, None)
                attempt = claim_step(self.parts, definition, position, message, None, holder, span)
                if attempt is not None:
                    held = (attempt, holder)
                    return self._run_claimed(definition, position, message, held, None, span)
        scope = record_at(definition, message) if definition is not None else None
        return self._run_checked(message, redelivered, scope)

    def _run_checked(self, message: NodeMessage, redelivered: bool, scope: str | None) -> Outcome:
        """Admission decided on a fresh read of the run. A duplicate of a node held by a live
        lease is dropped; a *redelivered* one waits for the lease to expire, since its holder
        may be the worker that died. ``scope``: the record the position runs under, when the
        message's version names it; then only that record is read with the run, not every
        step (guarantee 32), and what needs them all reads them when it needs them."""
        now = get_clock().now()
        snapshot = queries.load_run_with_step(self.parts.db, message.execution_id, scope)
        full = snapshot if scope is None else None
        execution, steps = snapshot
        adopt(None if execution is None else execution.trace_context)
        definition = None
        if execution is not None and execution.state is ExecutionState.RUNNING:
            # Only the run's own version handles it; without it: VersionNotDeployedError.
            definition = self.parts.definition_of(execution)
        deployed = definition.hash if definition else None
        verdict = decide_admission(execution, None, message, deployed, now)
        if verdict is not Admission.RUN or execution is None or definition is None:
            if execution is not None and execution.state is ExecutionState.CANCELLING:
                self.continue_cancel(execution)  # a message that meets a cancel moves it on
            return self._refused(message, verdict)
        match definition.nodes[message.node]:
            case WaitNode() as gate:
                self.carry_out(self.waits.arrive(definition, message, gate))
                return NoBody(f"the gate of {gate.event!r}")
            case SubSagaNode() as node:
                read = full or self._full(message)
                return self._enter_child(definition, read, message, node)
            case _:
                pass
        try:
            position = resolve(self.parts.db, definition, full, message)
        except CHOICE_ERRORS as error:
            at = (message.node, message.sub)
            self.carry_out(FailRun(definition, execution.id, describe_error(error), at))
            return NoBody("a choice that could not be made")
        if position.spec is None:
            return self._pass_position(definition, message)
        if full is None and position.record_name != scope:
            full = self._full(message)  # another version's graph named another record
            execution, steps = full
            assert execution is not None
        return self._admit_step(
            definition, position, message, (execution, steps), full, redelivered
        )

    def _full(self, message: NodeMessage) -> Snapshot:
        return queries.load_snapshot(self.parts.db, message.execution_id)

    def _refused(self, message: NodeMessage, verdict: Admission) -> NoBody:
        return forward_moves.refused(self.parts, message, verdict.value)

    def _enter_child(
        self, definition: SagaDefinition, read: Snapshot, message: NodeMessage, node: SubSagaNode
    ) -> Outcome:
        """A sub-saga node: start its child, wait for it, or settle on how it ended."""
        move = self.children.enter(definition, read, message, node)
        self.carry_out(move)
        if isinstance(move, FailStep):
            step = move.step
            failed = attempt_failed("step", definition.name, step.name, step.attempt, move.reason)
            return Failed(failed)
        return NoBody(f"the sub-saga node {node.name!r}")

    def _pass_position(self, definition: SagaDefinition, message: NodeMessage) -> NoBody:
        """Nothing runs at this position: move past the node."""
        onward = forward_moves.pass_position(self.parts, definition, message)
        if onward is None:
            return self._refused(message, Admission.REJECT_STALE_CURSOR)
        self.carry_out(onward)
        return NoBody("nothing runs at this position")

    def _admit_step(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        read: tuple[ExecutionRecord, list[StepRecord]],
        snapshot: Snapshot | None,
        redelivered: bool,
    ) -> Outcome:
        """``read``: the run and at least the record at this position; ``snapshot``: the
        run with all its steps, if read (the step's context is read from it)."""
        now = get_clock().now()
        execution, steps = read
        record = next((s for s in steps if s.name == position.record_name), None)
        verdict = decide_admission(execution, record, message, definition.hash, now)
        fenced, asked = False, None
        if record is not None and record.status is StepStatus.RUNNING and verdict in _CLAIMED:
            claim = HeldClaim(
                "step",
                message.execution_id,
                record.name,
                record.attempts,
                record.holder,
                lease_live=verdict is Admission.REJECT_IN_FLIGHT,
            )
            if claim.lease_live and not redelivered:
                return self._refused(message, verdict)
            takeover, answer = judge(self.parts.holders, claim)
            if takeover is Takeover.LEAVE:
                if not redelivered:
                    return self._refused(message, Admission.REJECT_IN_FLIGHT)
                wait = self.parts.until_released(record.lease_expires_at, claim.lease_live)
                self.carry_out(PublishNode(definition, message, spec=position.spec, countdown=wait))
                return NoBody("held back while the attempt in flight holds its claim")
            fenced, asked = takeover is Takeover.TAKE_OVER_FENCED, (claim, answer)
        elif verdict is not Admission.RUN:
            if verdict is Admission.REJECT_ALREADY_DONE and isinstance(
                definition.nodes[message.node], ParallelNode
            ):
                # a join its counts missed is owed
                self.carry_out(self.interpreter.steps.rejoin(definition, message))
            return self._refused(message, verdict)
        holder = self.parts.holders.me()
        if not fenced:
            take = lambda: claim_step(self.parts, definition, position, message, record, holder)  # noqa: E731
            steps_ = self.interpreter.steps
            lost = steps_.exhausted(definition, position, message, record, take)
            if lost is not None:
                self.carry_out(lost)
                return NoBody("no attempt left after lost ones")
        door = self._door(definition, position, message, execution)
        if isinstance(door, NoBody):
            return door
        try:
            span = self._span(definition, position, message, execution.trace_context)
            if record is not None and record.status is StepStatus.RUNNING:
                span.after_lost(record.attempts)
            attempt = claim_step(self.parts, definition, position, message, record, holder, span)
            if attempt is None:
                read_as = (record, holder, snapshot)
                return self._claim_refused(definition, position, message, read_as, span)
            if asked is not None:
                taken_over(*asked)
            claimed = (attempt, holder)
            return self._run_claimed(definition, position, message, claimed, snapshot, span)
        finally:
            if door is not None:
                self._leave(position, door)

    def _door(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        execution: ExecutionRecord,
    ) -> StepDoor | NoBody | None:
        """A limited step's door (``runtime/step_flow.py``): its place when it may claim
        now, NoBody when it waits (its message acked: no worker slot held), None: no door."""
        spec = position.spec
        if not is_limited(spec):
            return None
        assert spec is not None
        door = self.step_flow.door(definition, position, message, execution)
        if isinstance(door, DoorAnswer):  # no key: the run fails
            self.carry_out(door.moves)
            return NoBody(f"no flow-control key for step {spec.name!r}")
        answer = self.step_flow.enter(definition, spec, door, message)
        self.carry_out(answer.moves)
        return door if answer.go else NoBody(f"waiting for {answer.why}")

    def _leave(self, position: Position, door: StepDoor) -> None:
        """The step's attempt is over at its door: the waiters it frees are sent on."""
        assert position.spec is not None
        try:
            self.carry_out(self.step_flow.leave(position.spec, door))
        except Exception:  # the attempt's outcome stands; the next door sends them
            logger.warning("step %r: the waiters its slot frees were not sent", door.record)

    def _span(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        stored_trace: str | None,
    ) -> AttemptSpan:
        """The span of the attempt about to be claimed, in the run's trace: as read with
        the run (``stored_trace``), else as its message carries it."""
        run = (definition.name, definition.hash, message.execution_id)
        name = position.record_name
        key = record_key(message.execution_id, name, "forward")
        traces = (stored_trace or carried(), None)
        return self.parts.tracer.attempt(Direction.FORWARD, run, name, key, traces)

    def _claim_refused(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        read_as: tuple[StepRecord | None, str, Snapshot | None],
        span: AttemptSpan,
    ) -> Outcome:
        """A claim refused (``read_as``: the record, holder and snapshot it was made with,
        ``span``: the attempt's, never ended unless a claim is granted):
        a pause of the step holds the run at its door; a pause lifted between the claim
        and the hold lets the claim be tried once more. (A pause lifted and stored again
        in that instant leaves the run to the recovery sweep, which sends its message.)"""
        (record, holder, snapshot), spec = read_as, position.spec
        assert spec is not None
        if not isinstance(definition.nodes[message.node], ParallelNode):
            held = self.pauses.hold_at_door(definition, spec.name, position.record_name, message)
            if held is not None:
                self.carry_out(held)
                return NoBody(f"step {spec.name!r} is paused")
            attempt = claim_step(self.parts, definition, position, message, record, holder, span)
            if attempt is not None:
                claimed = (attempt, holder)
                return self._run_claimed(definition, position, message, claimed, snapshot, span)
        return self._refused(message, Admission.REJECT_IN_FLIGHT)

    def _run_claimed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        claimed: tuple[int, str],
        snapshot: Snapshot | None,
        span: AttemptSpan,
    ) -> Outcome:
        """Run the attempt ``claimed`` (its number, and the holder name it was claimed by)
        in its ``span``."""
        (attempt, holder), now = claimed, get_clock().now()
        held = Attempt(
            message.execution_id,
            position.record_name,
            message.node,
            message.sub,
            attempt,
            now,
            holder,
        )
        steps = self.interpreter.steps
        run = StepSide(self.parts, steps, definition, position, message, held, snapshot, span)
        self.parts.emit("saga-step-started", {**run.fields, "version": definition.hash})
        return run_and_carry_out(self.parts, run, self.carry_out)
