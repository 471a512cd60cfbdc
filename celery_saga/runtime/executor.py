"""Forward execution of one node message: admit, run the body, record, publish the next."""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.cursor import Advance, advance, first_position
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import (
    BranchNode,
    ParallelNode,
    StepNode,
    SubSagaNode,
    WaitNode,
)
from celery_saga.errors import BranchPathError, LoopError, PayloadError, UnknownSagaError
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus
from celery_saga.runtime.children import Children
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.contexts import Snapshot, step_context
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.failures import StepFailures
from celery_saga.runtime.invoke import invoke_step
from celery_saga.runtime.keys import record_key
from celery_saga.runtime.navigation import Position, choose_path, node_at, resolve, route
from celery_saga.runtime.ports import Catalog, EventSink, Publisher, Settings
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.runtime.unwinder import Unwinder
from celery_saga.runtime.waits import Waits
from celery_saga.store import forward, queries
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")

#: What a control-flow choice raises when it cannot be made: the run fails, unwound.
CHOICE_ERRORS = (BranchPathError, LoopError, PayloadError)


class Executor(StepFailures):
    """Carries out forward decisions; every rule it follows lives in ``decisions/``."""

    def __init__(
        self,
        db: Database,
        registry: Catalog,
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
    ) -> None:
        super().__init__(db, registry, publisher, emit, settings)
        self.unwinder = Unwinder(db, registry, publisher, emit, settings)
        self.waits = Waits(self)
        self.children = Children(self)

    # -- starting ---------------------------------------------------------------------
    def create(
        self,
        definition: SagaDefinition,
        saga_input: Any,
        execution_id: str,
        parent_execution_id: str | None = None,
    ) -> None:
        """Store a new run at its first position (one INSERT; a taken id raises
        ``IntegrityError``)."""
        blob = pack(
            saga_input,
            what=f"input of saga {definition.name!r}",
            limit=self.settings.max_payload_bytes,
        )
        first = first_position(definition.nodes)
        queries.create_execution(
            self.db,
            execution_id=execution_id,
            saga_name=definition.name,
            definition_hash=definition.hash,
            input_blob=blob,
            node=first.node,
            sub=0,
            state=ExecutionState.RUNNING,
            committed=first.passes_pivot,
            now=get_clock().now(),
            parent_execution_id=parent_execution_id,
        )

    def launch(
        self,
        definition: SagaDefinition,
        execution_id: str,
        parent_execution_id: str | None = None,
        announce: bool = True,
    ) -> None:
        """Send the first message of a stored run (and, with ``announce``, its
        ``saga-started`` event). A broker that refuses it leaves the run marked as owed a
        message (see ``CeleryPublisher``); the run is stored either way."""
        fields = {"execution_id": execution_id, "saga": definition.name}
        if parent_execution_id is not None:
            fields["parent_execution_id"] = parent_execution_id
        if announce:
            self.emit("saga-started", fields)
        first = first_position(definition.nodes)
        self.publish_position(definition, execution_id, first.node, 0)

    # -- publishing -------------------------------------------------------------------
    def publish_position(
        self, definition: SagaDefinition, execution_id: str, node: int, sub: int
    ) -> None:
        target = definition.nodes[node]
        message = NodeMessage(execution_id, node, sub, 0, 1)
        if isinstance(target, ParallelNode):
            for member, spec in enumerate(target.steps):
                message = NodeMessage(execution_id, node, 0, member, 1)
                self.publisher.publish_node(definition.name, spec, message)
            return
        if isinstance(target, WaitNode):
            label = f"{definition.name}.wait:{target.event}"
            self.publisher.publish_node(definition.name, None, message, label=label)
            return
        if isinstance(target, SubSagaNode):
            label = f"{definition.name}.{target.name}"
            self.publisher.publish_node(definition.name, None, message, label=label)
            return
        if isinstance(target, BranchNode):
            try:
                path = target.paths[choose_path(self.db, definition, target, execution_id, node)]
            except BranchPathError as error:
                self.fail_outside_step(definition, execution_id, describe_error(error))
                return
            self.publisher.publish_node(definition.name, path[sub], message)
            return
        self.publisher.publish_node(definition.name, route(target, sub, 0), message)

    # -- running a node ---------------------------------------------------------------
    def run_node(
        self, message: NodeMessage, saga_name: str | None = None, redelivered: bool = False
    ) -> None:
        """Handle one node message.

        Fast path (first delivery of a first attempt of a plain or parallel step): claim
        straight away; the claim's WHERE clause is the admission predicate (live run, this
        position, deployed graph, no START record yet). Anything else, or a refused claim,
        takes the checked path: read the run and let ``decide_admission`` say what to do.
        """
        definition = self.registry(saga_name) if saga_name else None
        if definition is not None and message.attempt == 1 and not redelivered:
            target = node_at(definition, message)
            if isinstance(target, (StepNode, ParallelNode)):
                spec = route(target, 0, message.member)
                assert spec is not None
                position = Position(spec, spec.name)
                attempt = self._claim(definition, position, message, None)
                if attempt is not None:
                    self._run_claimed(definition, position, message, attempt, None)
                    return
        self._run_checked(message, redelivered)

    def _run_checked(self, message: NodeMessage, redelivered: bool) -> None:
        """Admission decided on a fresh snapshot. A duplicate of a node held by a live lease
        is dropped; a *redelivered* one waits for the lease to expire, since its holder may
        be the worker that died."""
        now = get_clock().now()
        snapshot = queries.load_snapshot(self.db, message.execution_id)
        execution, steps = snapshot
        definition = self.registry(execution.saga_name) if execution else None
        deployed = definition.hash if definition else None
        verdict = decide_admission(execution, None, message, deployed, now)
        if verdict is Admission.REJECT_DEFINITION_CHANGED and execution and definition:
            self._definition_changed(definition, execution)
            return
        if execution is not None and definition is None:
            # A worker without this saga imported must not swallow the message silently.
            raise UnknownSagaError(
                f"saga {execution.saga_name!r} of execution {execution.id!r} is not registered "
                "on this worker; import its definitions module in every worker"
            )
        if verdict is not Admission.RUN or execution is None or definition is None:
            self.refused(message, verdict)
            return
        target = definition.nodes[message.node]
        if isinstance(target, WaitNode):
            self.waits.arrive(definition, message, target)
            return
        if isinstance(target, SubSagaNode):
            self.children.enter(definition, snapshot, message, target)
            return
        try:
            position = resolve(self.db, definition, snapshot, message)
        except CHOICE_ERRORS as error:
            self.fail_outside_step(definition, execution.id, describe_error(error))
            return
        if position.spec is None:
            self._pass(definition, message)
            return
        self._admit_step(definition, position, message, steps, snapshot, redelivered)

    def _admit_step(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        steps: list[StepRecord],
        snapshot: Snapshot,
        redelivered: bool,
    ) -> None:
        now = get_clock().now()
        execution = snapshot[0]
        record = next((s for s in steps if s.name == position.record_name), None)
        verdict = decide_admission(execution, record, message, definition.hash, now)
        if verdict is Admission.REJECT_IN_FLIGHT and redelivered and record:
            assert record.lease_expires_at is not None and position.spec is not None
            wait = (record.lease_expires_at - now).total_seconds() + 1
            logger.warning(
                "execution %s: redelivered message for step %r held back %.0f s, until the "
                "lease of the attempt in flight ends (its worker may be the one that died)",
                message.execution_id,
                position.record_name,
                wait,
            )
            self.publisher.publish_node(definition.name, position.spec, message, countdown=wait)
            return
        if verdict is not Admission.RUN:
            self.refused(message, verdict)
            return
        take = lambda: self._claim(definition, position, message, record)  # noqa: E731
        if self._exhausted(definition, position, message, record, take):
            return
        attempt = self._claim(definition, position, message, record)
        if attempt is None:
            self.refused(message, Admission.REJECT_IN_FLIGHT)
            return
        self._run_claimed(definition, position, message, attempt, snapshot)

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
        )

    def _run_claimed(
        self,
        definition: SagaDefinition,
        position: Position,
        message: NodeMessage,
        attempt: int,
        snapshot: Snapshot | None,
    ) -> None:
        spec = position.spec
        assert spec is not None
        execution_id, name = message.execution_id, position.record_name
        key = record_key(execution_id, name, "forward")
        fields = {
            "execution_id": execution_id,
            "saga": definition.name,
            "step": name,
            "attempt": attempt,
            "idempotency_key": key,
        }
        self.emit("saga-step-started", fields)
        loop = (position.iteration, position.item, position.for_each)
        renew = functools.partial(
            forward.renew_step_lease, self.db, execution_id=execution_id, name=name, attempt=attempt
        )
        what = f"step {name!r} of execution {execution_id}"
        with self.holding(lambda expiry: renew(lease_expires_at=expiry), what):
            try:
                ctx = step_context(
                    self.db, definition, spec, name, execution_id, key, attempt, snapshot, loop
                )
            except SQLAlchemyError:
                raise  # the store failed, not the step: the claim waits for its lease or a retry
            except Exception as error:
                self._step_failed(definition, position, message, attempt, error)
                return
            try:
                blob = pack(
                    invoke_step(definition.name, spec, ctx),
                    what=f"result of step {name!r} of saga {definition.name!r}",
                    limit=self.settings.max_payload_bytes,
                )
            except (Exception, SystemExit) as error:
                # Everything the step does counts as its attempt, ``sys.exit()`` included:
                # an error here must settle it, or the run would wait for its lease.
                self._step_failed(definition, position, message, attempt, error)
                return
            step_advance = advance(definition.nodes, message.node, message.sub, position.length)
            self.step_completed(definition, name, message, attempt, blob, step_advance, fields)

    def step_completed(
        self,
        definition: SagaDefinition,
        name: str,
        message: NodeMessage,
        attempt: int,
        blob: bytes,
        step_advance: Advance,
        fields: dict[str, Any],
    ) -> None:
        """Record ``name`` completed and move the run on (a parallel member: join first).
        The result exists only in this process: its record is retried through store outages
        (guarantee 20) rather than left to a lease that would run the body again."""
        target = definition.nodes[message.node]
        if not isinstance(target, ParallelNode):
            if write_outcome(
                lambda: forward.record_step_completed(
                    self.db,
                    execution_id=message.execution_id,
                    name=name,
                    attempt=attempt,
                    node=message.node,
                    sub=message.sub,
                    result_blob=blob,
                    advance=step_advance,
                    now=get_clock().now(),
                ),
                budget=self.settings.outcome_retry_budget,
                what=f"the result of step {name!r} of execution {message.execution_id}",
                landed=lambda: self.landed(
                    message.execution_id, name, attempt, StepStatus.COMPLETED
                ),
                if_landed=True,
            ):
                self.emit("saga-step-completed", fields)
                self.advanced(definition, message.execution_id, step_advance)
            return
        members = [s.name for s in target.steps]
        group = self.settle(
            definition, message, name, attempt, members, step_advance, result_blob=blob
        )
        if group is None:
            return
        self.emit("saga-step-completed", fields)
        if not group.settled:
            return
        if group.unwind is not None:
            self.unwinder.begin(
                definition, message.execution_id, group.unwind, group.failure_reason
            )
        else:
            self.advanced(definition, message.execution_id, step_advance)

    def advanced(
        self, definition: SagaDefinition, execution_id: str, step_advance: Advance
    ) -> None:
        """The run moved to ``step_advance`` (committed): publish it, or report the end."""
        if step_advance.finished:
            self.emit("saga-completed", {"execution_id": execution_id, "saga": definition.name})
            self.unwinder.settled(definition, execution_id)
        else:
            self.publish_position(definition, execution_id, step_advance.node, step_advance.sub)

    def _pass(self, definition: SagaDefinition, message: NodeMessage) -> None:
        """Nothing runs at this position (a loop ended): move past the node."""
        onward = advance(definition.nodes, message.node, 0)
        if forward.pass_position(
            self.db,
            execution_id=message.execution_id,
            node=message.node,
            sub=message.sub,
            advance=onward,
            now=get_clock().now(),
        ):
            self.advanced(definition, message.execution_id, onward)
        else:
            self.refused(message, Admission.REJECT_STALE_CURSOR)

    def _definition_changed(self, definition: SagaDefinition, execution: ExecutionRecord) -> None:
        reason = (
            f"DefinitionChangedError: saga {definition.name!r} was deployed with structure "
            f"{definition.hash} while execution {execution.id!r} was running on "
            f"{execution.definition_hash}; it was not run against the new graph"
        )
        logger.error(reason)
        self.fail_outside_step(definition, execution.id, reason)

    def refused(self, message: NodeMessage, verdict: Admission) -> None:
        logger.info("node message %s refused: %s", message, verdict.value)
        self.emit(
            "saga-message-refused",
            {"execution_id": message.execution_id, "node": message.node, "reason": verdict.value},
        )
