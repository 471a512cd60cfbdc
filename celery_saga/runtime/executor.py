"""Forward execution of one node message: admit, run the body, record, publish the next."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.cursor import advance
from celery_saga.decisions.lost_claims import ClaimState
from celery_saga.decisions.takeover import Takeover
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import (
    ParallelNode,
    StepNode,
    SubSagaNode,
    WaitNode,
)
from celery_saga.errors import BranchPathError, LoopError, PayloadError, PayloadKeyError
from celery_saga.records import ExecutionRecord, ExecutionState, StepAttempt, StepRecord, StepStatus
from celery_saga.redaction import scrub
from celery_saga.runtime.cancel import Cancellation
from celery_saga.runtime.children import Children
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.contexts import Snapshot, step_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.holders import HeldClaim, Holders, attempt_running
from celery_saga.runtime.invoke import invoke_step
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.moves import (
    BeginUnwind,
    CompleteStep,
    FailRun,
    FailStep,
    FollowUnwind,
    Move,
    MoveOn,
    PublishNode,
    PublishReversal,
    RecordReversal,
    Refuse,
    StartChild,
    Stay,
    unreachable,
)
from celery_saga.runtime.navigation import Position, node_at, record_at, resolve, route
from celery_saga.runtime.outcomes import (
    Failed,
    NoBody,
    Outcome,
    Ran,
    TakenOver,
    attempt_failed,
    no_body_if_taken_over,
)
from celery_saga.runtime.ports import Catalog, EventSink, Publisher, Settings
from celery_saga.runtime.progress import Progress
from celery_saga.runtime.scrubbing import failure_secrets, shown_result
from celery_saga.runtime.stopping import worker_is_stopping
from celery_saga.runtime.takeovers import judge, keep_late_outcome, taken_over
from celery_saga.runtime.unwinder import Unwinder
from celery_saga.runtime.waits import Waits
from celery_saga.store import forward, queries, waits
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")

#: Admissions of a message that meets a claim in flight: a live one, or a lapsed one.
_CLAIMED = (Admission.REJECT_IN_FLIGHT, Admission.RUN)
#: What a control-flow choice raises when it cannot be made: the run fails, unwound.
CHOICE_ERRORS = (BranchPathError, LoopError, PayloadError)


class Executor(Progress):
    """Carries out forward decisions; every rule it follows lives in ``decisions/``."""

    def __init__(
        self,
        db: Database,
        registry: Catalog,
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
        holders: Holders | None = None,
    ) -> None:
        super().__init__(db, registry, publisher, emit, settings, holders)
        self.unwinder = Unwinder(db, registry, publisher, emit, settings, self.holders)
        parts = self.parts()
        self.waits, self.children = Waits(parts), Children(parts)
        self.cancellation = Cancellation(parts, self.unwinder.begin, self._definition_of)

    def _definition_of(self, execution: ExecutionRecord) -> SagaDefinition:
        return self.registry.for_run(execution.saga_name, execution.definition_hash, execution.id)

    def continue_cancel(self, execution: ExecutionRecord) -> None:
        """Begin a cancelled run's unwind once nothing of it is going (guarantee 31)."""
        self.cancellation.resume_cancel(self._definition_of(execution), execution.id)

    def carry_out(self, move: Move) -> None:
        """Do what a helper decided: the store write that follows it, then the publish."""
        match move:
            case MoveOn(definition, execution_id, onward):
                self.advanced(definition, execution_id, onward)
            case FailRun(definition, execution_id, reason, at):
                self.fail_outside_step(definition, execution_id, reason, at)
            case Refuse(message, verdict):
                self.refused(message, verdict)
            case FailStep(definition, step, raw):
                # A child's failure text, scrubbed by the child's markings, and by ours here.
                reason = scrub(raw, failure_secrets(self.db, definition, step.execution_id))
                self.settle_failure(definition, step, [step.name], reason, None)
                self.emit(
                    "saga-step-failed",
                    {
                        "execution_id": step.execution_id,
                        "saga": definition.name,
                        "step": step.name,
                        "attempt": step.attempt,
                        "error": reason,
                    },
                )
            case CompleteStep(definition, step, blob, onward, fields):
                self.step_completed(definition, step, blob, onward, fields)
            case StartChild():
                self._start_child(move)
            case (
                Stay()
                | BeginUnwind()
                | FollowUnwind()
                | PublishNode()
                | PublishReversal()
                | RecordReversal()
            ):
                self.unwinder.carry_out(move)
            case _:
                unreachable(move)

    def _start_child(self, move: StartChild) -> None:
        try:
            self.create(move.definition, move.child_input, move.child_id, move.parent_id)
        except IntegrityError:
            logger.info("execution %s adopts its existing child %s", move.parent_id, move.child_id)
            return
        self.launch(move.definition, move.child_id, parent_execution_id=move.parent_id)

    def fire_timers(self, page: int = 200, most: int = 10_000) -> int:
        """Fire every wait whose deadline passed (see ``Waits.expire``); returns how many
        runs were moved. Safe with several sweepers at once."""
        now = get_clock().now()
        acted = seen = 0
        after = None
        while seen < most:
            rows = waits.list_expired_waits(self.db, now=now, limit=page, after=after)
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
        known = self.registry.known
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
        snapshot = queries.load_run_with_step(self.db, message.execution_id, scope)
        full = snapshot if scope is None else None
        execution, steps = snapshot
        definition = None
        if execution is not None and execution.state is ExecutionState.RUNNING:
            # Only the run's own version handles it; without it: VersionNotDeployedError.
            definition = self.registry.for_run(
                execution.saga_name, execution.definition_hash, execution.id
            )
        deployed = definition.hash if definition else None
        verdict = decide_admission(execution, None, message, deployed, now)
        if verdict is not Admission.RUN or execution is None or definition is None:
            if execution is not None and execution.state is ExecutionState.CANCELLING:
                self.continue_cancel(execution)  # a message that meets a cancel moves it on
            return self.refused(message, verdict)
        target = definition.nodes[message.node]
        if isinstance(target, WaitNode):
            self.carry_out(self.waits.arrive(definition, message, target))
            return NoBody(f"the gate of {target.event!r}")
        if isinstance(target, SubSagaNode):
            move = self.children.enter(definition, full or self._full(message), message, target)
            self.carry_out(move)
            if isinstance(move, FailStep):
                step = move.step
                failed = attempt_failed(
                    "step", definition.name, step.name, step.attempt, move.reason
                )
                return Failed(failed)
            return NoBody(f"the sub-saga node {target.name!r}")
        try:
            position = resolve(self.db, definition, full, message)
        except CHOICE_ERRORS as error:
            at = (message.node, message.sub)
            self.fail_outside_step(definition, execution.id, describe_error(error), at)
            return NoBody("a choice that could not be made")
        if position.spec is None:
            return self.pass_position(definition, message)
        if full is None and position.record_name != scope:
            full = self._full(message)  # another version's graph named another record
            execution, steps = full
            assert execution is not None
        return self._admit_step(
            definition, position, message, (execution, steps), full, redelivered
        )

    def _full(self, message: NodeMessage) -> Snapshot:
        return queries.load_snapshot(self.db, message.execution_id)

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
            spec = position.spec
            assert spec is not None
            claim = HeldClaim(
                "step",
                message.execution_id,
                record.name,
                record.attempts,
                record.holder,
                lease_live=verdict is Admission.REJECT_IN_FLIGHT,
            )
            if claim.lease_live and not redelivered:
                return self.refused(message, verdict)
            takeover, answer = judge(self.holders, claim)
            if takeover is Takeover.LEAVE:
                if not redelivered:
                    return self.refused(message, Admission.REJECT_IN_FLIGHT)
                wait = self.until_released(record.lease_expires_at, claim.lease_live)
                self.publisher.publish_node(
                    definition.name, spec, message, countdown=wait, version=definition.hash
                )
                return NoBody("held back while the attempt in flight holds its claim")
            fenced, asked = takeover is Takeover.TAKE_OVER_FENCED, (claim, answer)
        elif verdict is not Admission.RUN:
            if verdict is Admission.REJECT_ALREADY_DONE and isinstance(
                definition.nodes[message.node], ParallelNode
            ):
                self.rejoin(definition, message)  # a join its counts missed is owed
            return self.refused(message, verdict)
        take = lambda: self._claim(definition, position, message, record)  # noqa: E731
        if not fenced and self._exhausted(definition, position, message, record, take):
            return NoBody("no attempt left after lost ones")
        attempt = self._claim(definition, position, message, record)
        if attempt is None:
            return self.refused(message, Admission.REJECT_IN_FLIGHT)
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
            self.db,
            execution_id=message.execution_id,
            name=position.record_name,
            node=message.node,
            sub=message.sub,
            definition_hash=definition.hash,
            idempotency_key=record_key(message.execution_id, position.record_name, "forward"),
            compensatable=spec.compensatable,
            lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
            now=now,
            existing=record,
            holder=self.holders.me(),
        )

    def _run_claimed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        attempt: int,
        snapshot: Snapshot | None,
    ) -> Outcome:
        spec = position.spec
        assert spec is not None
        execution_id, name = message.execution_id, position.record_name
        now, holder = get_clock().now(), self.holders.me()
        held = StepAttempt(execution_id, name, message.node, message.sub, attempt, now, holder)
        key = record_key(execution_id, name, "forward")
        fields = {
            "execution_id": execution_id,
            "saga": definition.name,
            "step": name,
            "attempt": attempt,
            "idempotency_key": key,
        }
        self.emit("saga-step-started", {**fields, "version": definition.hash})
        loop = (position.iteration, position.item, position.for_each)
        what = f"step {name!r} of execution {execution_id}"
        with (
            self.holding(self.renewals.of_step(held, spec.compensatable), what),
            attempt_running("step", execution_id, name, attempt, self.db, holder),
        ):
            try:
                ctx = step_context(
                    self.db, definition, spec, name, execution_id, key, attempt, snapshot, loop
                )
            except (SQLAlchemyError, PayloadKeyError):
                raise  # the store (or a key) failed, not the step: the claim waits its lease
            except Exception as error:
                failed = self._step_failed(definition, position, message, held, error)
                return no_body_if_taken_over(failed)
            try:
                result = invoke_step(definition.name, spec, ctx)
                blob = pack(
                    result,
                    what=f"result of step {name!r} of saga {definition.name!r}",
                    limit=self.settings.max_payload_bytes,
                )
            except (Exception, SystemExit) as error:
                # Everything the step does counts as its attempt, ``sys.exit()`` included:
                # an error here must settle it, or the run would wait for its lease. Only
                # the worker's own shutdown is not the step's (given up once the heartbeat
                # has stopped, below).
                if not worker_is_stopping(error):
                    return self._step_failed(definition, position, message, held, error)
                stopped = error
            else:
                step_advance = advance(definition.nodes, message.node, message.sub, position.length)
                shown = shown_result(definition, name, result)
                if self.step_completed(definition, held, blob, step_advance, fields):
                    return Ran(shown)
                if self.refused_while_cancelling(held):
                    return TakenOver(f"step {name!r} of a cancelled run", shown)
                try:
                    by_other = self.lost_claims.step(held, None) is ClaimState.TAKEN
                except SQLAlchemyError:  # the result is kept all the same, best effort
                    by_other = True
                step = f"step {name!r}"
                keep_late_outcome(
                    self.db, execution_id, step, name, attempt, key, blob, holder, by_other
                )
                taken = f"step {name!r} of execution {execution_id} attempt {attempt}"
                return TakenOver(taken, shown)
        return self.interrupted(definition, spec, message, held, stopped)
