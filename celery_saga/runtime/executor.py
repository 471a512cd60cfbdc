"""Forward execution of one node message: admit it, route it (a gate, a sub-saga, a step,
a position with nothing to run), and hand what follows to the interpreter; every rule it
follows lives in ``decisions/``."""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.decisions.cursor import advance
from celery_saga.decisions.takeover import Takeover
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode, StepNode, SubSagaNode, WaitNode
from celery_saga.errors import BranchPathError, LoopError, PayloadError
from celery_saga.records import ExecutionRecord, ExecutionState, StepAttempt, StepRecord, StepStatus
from celery_saga.runtime import forward_moves
from celery_saga.runtime.attempt import run_attempt
from celery_saga.runtime.cancel import DEADLINE
from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.children import Children
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.contexts import Snapshot
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.holders import HeldClaim, Holders
from celery_saga.runtime.interpreter import Interpreter
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import FailRun, FailStep, MoveOn, PublishNode, Stay
from celery_saga.runtime.navigation import Position, node_at, record_at, resolve, route
from celery_saga.runtime.outcomes import Failed, NoBody, Outcome, attempt_failed
from celery_saga.runtime.parts import Parts
from celery_saga.runtime.ports import EventSink, Publisher, Settings
from celery_saga.runtime.step_attempt import StepRun
from celery_saga.runtime.takeovers import judge, taken_over
from celery_saga.runtime.unwinder import Unwinder
from celery_saga.runtime.waits import Waits
from celery_saga.store import forward, queries, waits
from celery_saga.store.database import Database

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
        # Views of the parts that the worker reads (the parts themselves are frozen).
        self.publisher, self.holders = parts.publisher, parts.holders
        self.lost_claims, self.renewals = parts.lost_claims, parts.renewals
        #: Store a new run (see ``forward_moves.create``).
        self.create = functools.partial(forward_moves.create, parts)

    # -- the engine's calls on runs ---------------------------------------------------
    def launch(self, definition: SagaDefinition, execution_id: str, **options: Any) -> None:
        """Send the first message of a stored run (see ``forward_moves.launch``)."""
        self.carry_out(forward_moves.launch(self.parts, definition, execution_id, **options))

    def continue_cancel(self, execution: ExecutionRecord) -> None:
        """Begin a cancelled run's unwind once nothing of it is going (guarantee 31)."""
        cancellation = self.interpreter.cancellation
        self.carry_out(
            cancellation.resume_cancel(self.parts.definition_of(execution), execution.id)
        )

    def cancel(
        self, execution: ExecutionRecord, reason: str | None, actor: str | None = None
    ) -> CancelVerdict:
        """Cancel ``execution`` (see ``Cancellation.cancel``); returns what was done."""
        verdict, move = self.interpreter.cancellation.cancel(execution, reason, actor)
        self.carry_out(move)
        return verdict

    def cancel_overdue(self, page: int = 200) -> int:
        """Cancel every run whose deadline has passed (the timer sweep); returns how many."""
        cancellation, acted = self.interpreter.cancellation, 0
        for execution_id in cancellation.overdue(page):
            execution = queries.load_execution(self.parts.db, execution_id)
            if execution is None:
                continue
            verdict = self.cancel(execution, DEADLINE)
            if verdict is CancelVerdict.CANCEL:
                acted += 1
            else:
                cancellation.not_cancelled(execution_id, verdict)
        return acted

    def fire_timers(self, page: int = 200, most: int = 10_000) -> int:
        """Fire every wait whose deadline passed (see ``Waits.expire``); returns how many
        runs were moved. Safe with several sweepers at once."""
        now = get_clock().now()
        acted = seen = 0
        after = None
        while seen < most:
            rows = waits.list_expired_waits(self.parts.db, now=now, limit=page, after=after)
            for row in rows:
                try:
                    move = self.waits.expire(row, now)
                    self.carry_out(move)
                    acted += not isinstance(move, Stay)
                except Exception:
                    logger.exception("the deadline of execution %s could not be fired", row.id)
            seen += len(rows)
            if len(rows) < page:
                break
            after = (rows[-1].wake_at, rows[-1].id)
        return acted

    def signal(
        self,
        definition: SagaDefinition,
        execution_id: str,
        event: str,
        payload: Any,
        actor: str | None = None,
    ) -> bool:
        """Record the signal once; True if it resumed the run parked at its gate."""
        move = self.waits.signal(definition, execution_id, event, payload, actor)
        self.carry_out(move)
        return isinstance(move, MoveOn)

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
            if isinstance(target, (StepNode, ParallelNode)):
                spec = route(target, 0, message.member)
                assert spec is not None
                position = Position(spec, spec.name)
                attempt = self._claim(definition, position, message, None)
                if attempt is not None:
                    return self._run_claimed(definition, position, message, attempt, None)
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
        """Nothing runs at this position (a loop or ``for_each`` ended, or had nothing to
        run): move past the node."""
        onward = advance(definition.nodes, message.node, 0)
        if not forward.pass_position(
            self.parts.db,
            execution_id=message.execution_id,
            node=message.node,
            sub=message.sub,
            advance=onward,
            now=get_clock().now(),
        ):
            return self._refused(message, Admission.REJECT_STALE_CURSOR)
        passed: dict[str, Any] = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "node": message.node,
            "sub": message.sub,
            "version": definition.hash,
        }
        self.parts.emit("saga-node-passed", passed)
        self.carry_out(MoveOn(definition, message.execution_id, onward))
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
        if not fenced:
            take = lambda: self._claim(definition, position, message, record)  # noqa: E731
            steps_ = self.interpreter.steps
            lost = steps_.exhausted(definition, position, message, record, take)
            if lost is not None:
                self.carry_out(lost)
                return NoBody("no attempt left after lost ones")
        attempt = self._claim(definition, position, message, record)
        if attempt is None:
            return self._refused(message, Admission.REJECT_IN_FLIGHT)
        if asked is not None:
            taken_over(*asked)
        return self._run_claimed(definition, position, message, attempt, snapshot)

    def _claim(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        record: StepRecord | None,
    ) -> int | None:
        spec = position.spec
        assert spec is not None
        now = get_clock().now()
        return forward.claim_step(
            self.parts.db,
            execution_id=message.execution_id,
            name=position.record_name,
            node=message.node,
            sub=message.sub,
            definition_hash=definition.hash,
            idempotency_key=record_key(message.execution_id, position.record_name, "forward"),
            compensatable=spec.compensatable,
            lease_expires_at=now + timedelta(seconds=self.parts.settings.lease_seconds),
            now=now,
            existing=record,
            holder=self.parts.holders.me(),
        )

    def _run_claimed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        attempt: int,
        snapshot: Snapshot | None,
    ) -> Outcome:
        now, holder = get_clock().now(), self.parts.holders.me()
        held = StepAttempt(
            message.execution_id,
            position.record_name,
            message.node,
            message.sub,
            attempt,
            now,
            holder,
        )
        steps = self.interpreter.steps
        run = StepRun(self.parts, steps, definition, position, message, held, snapshot)
        self.parts.emit("saga-step-started", {**run.fields, "version": definition.hash})
        outcome, move = run_attempt(self.parts, run)
        self.carry_out(move)
        return outcome
