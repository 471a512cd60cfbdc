"""Forward execution of one node message: admit, run the body, record, publish the next."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.cursor import Advance, advance, first_position
from celery_saga.decisions.retry import backoff_delay
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import BranchNode, ParallelNode, StepSpec
from celery_saga.errors import (
    BranchPathError,
    PayloadError,
    SchemaValidationError,
    UnknownSagaError,
)
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord, StepStatus
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.context import SagaContext
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import apply_schema, call_arguments, run_with_timeout, storable
from celery_saga.runtime.keys import idempotency_key
from celery_saga.runtime.ports import EventSink, Publisher, RuntimeParts, Settings
from celery_saga.runtime.unwinder import Unwinder, compensations_of
from celery_saga.store import forward, queries
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")
T = TypeVar("T")
_LEASE_MARGIN = 30.0


def _results(steps: list[StepRecord]) -> dict[str, Any]:
    return {s.name: s.result for s in steps if s.status is StepStatus.COMPLETED}


class Executor(RuntimeParts):
    """Carries out forward decisions; every rule it follows lives in ``decisions/``."""

    def __init__(
        self,
        db: Database,
        registry: Callable[[str], SagaDefinition | None],
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
    ) -> None:
        super().__init__(db, registry, publisher, emit, settings)
        self.unwinder = Unwinder(db, registry, publisher, emit, settings)

    # -- starting ---------------------------------------------------------------------
    def start(
        self,
        definition: SagaDefinition,
        saga_input: Any,
        execution_id: str,
        parent_execution_id: str | None = None,
    ) -> None:
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
        self.emit("saga-started", {"execution_id": execution_id, "saga": definition.name})
        self._publish_position(definition, execution_id, first.node, 0)

    # -- publishing -------------------------------------------------------------------
    def _publish_position(
        self, definition: SagaDefinition, execution_id: str, node: int, sub: int
    ) -> None:
        target = definition.nodes[node]
        if isinstance(target, ParallelNode):
            for member, spec in enumerate(target.steps):
                message = NodeMessage(execution_id, node, 0, member, 1)
                self.publisher.publish_node(definition.name, spec, message)
            return
        try:
            spec, _ = self._resolve(definition, execution_id, node, sub, 0)
        except BranchPathError as error:
            self._fail_outside_step(definition, execution_id, describe_error(error))
            return
        self.publisher.publish_node(
            definition.name, spec, NodeMessage(execution_id, node, sub, 0, 1)
        )

    def _resolve(
        self, definition: SagaDefinition, execution_id: str, node: int, sub: int, member: int
    ) -> tuple[StepSpec, int]:
        """The step at a position and the length of the path it is on."""
        target = definition.nodes[node]
        if isinstance(target, ParallelNode):
            return target.steps[member], 1
        if isinstance(target, BranchNode):
            path = target.paths[self._choose_path(definition, target, execution_id, node)]
            return path[sub], len(path)
        return target.step, 1  # type: ignore[union-attr]

    def _choose_path(
        self, definition: SagaDefinition, branch: BranchNode, execution_id: str, node: int
    ) -> str:
        """Journal the branch choice before anything it selects runs (guarantee 12)."""
        key = f"branch:{node}"
        journaled = queries.load_decision(self.db, execution_id, key)
        if journaled is not None:
            return str(journaled[0])
        execution, steps = queries.load_snapshot(self.db, execution_id)
        assert execution is not None
        ctx = SagaContext(
            execution_id,
            definition.name,
            branch.name,
            execution.input,
            _results(steps),
            idempotency_key(execution_id, branch.name, 0, "forward"),
            1,
        )
        choice = branch.selector(ctx)
        if choice not in branch.paths:
            raise BranchPathError(
                f"saga {definition.name!r}, branch {branch.name!r}: selector returned "
                f"{choice!r}; defined paths are {sorted(branch.paths)}"
            )
        return str(queries.journal_decision(self.db, execution_id, key, choice, get_clock().now()))

    # -- running a node ---------------------------------------------------------------
    def run_node(self, message: NodeMessage, redelivered: bool = False) -> None:
        """Handle one node message. A duplicate of a node still held by a live lease is
        dropped; a *redelivered* one is deferred until the lease expires, since its holder
        may be the worker that died."""
        now = get_clock().now()
        execution, steps = queries.load_snapshot(self.db, message.execution_id)
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
            self._refused(message, verdict)
            return
        try:
            spec, path_length = self._resolve(
                definition, execution.id, message.node, message.sub, message.member
            )
        except BranchPathError as error:
            self._fail_outside_step(definition, execution.id, describe_error(error))
            return
        record = next((s for s in steps if s.name == spec.name), None)
        verdict = decide_admission(execution, record, message, deployed, now)
        if (
            verdict is Admission.REJECT_IN_FLIGHT
            and redelivered
            and record
            and record.lease_expires_at
        ):
            wait = (record.lease_expires_at - now).total_seconds() + 1
            self.publisher.publish_node(definition.name, spec, message, countdown=wait)
            return
        if verdict is not Admission.RUN:
            self._refused(message, verdict)
            return
        self._claim_and_run(definition, execution, steps, spec, message, record, path_length)

    def _claim_and_run(
        self,
        definition: SagaDefinition,
        execution: ExecutionRecord,
        steps: list[StepRecord],
        spec: StepSpec,
        message: NodeMessage,
        record: StepRecord | None,
        path_length: int,
    ) -> None:
        now = get_clock().now()
        key = idempotency_key(execution.id, spec.name, 0, "forward")
        lease = spec.timeout + _LEASE_MARGIN if spec.timeout else self.settings.lease_seconds
        attempt = forward.claim_step(
            self.db,
            execution_id=execution.id,
            name=spec.name,
            node=message.node,
            sub=message.sub,
            idempotency_key=key,
            compensatable=spec.compensatable,
            lease_expires_at=now + timedelta(seconds=lease),
            now=now,
            existing=record,
        )
        if attempt is None:
            self._refused(message, Admission.REJECT_IN_FLIGHT)
            return
        fields = {
            "execution_id": execution.id,
            "saga": definition.name,
            "step": spec.name,
            "attempt": attempt,
            "idempotency_key": key,
        }
        self.emit("saga-step-started", fields)
        ctx = SagaContext(
            execution.id, definition.name, spec.name, execution.input, _results(steps), key, attempt
        )
        try:
            blob = pack(
                self._invoke(definition, spec, ctx),
                what=f"result of step {spec.name!r} of saga {definition.name!r}",
                limit=self.settings.max_payload_bytes,
            )
        except Exception as error:
            self._step_failed(definition, execution, spec, message, attempt, error)
            return
        step_advance = advance(definition.nodes, message.node, message.sub, path_length)
        self._step_completed(
            definition, execution, spec, message, attempt, blob, step_advance, fields
        )

    def _invoke(self, definition: SagaDefinition, spec: StepSpec, ctx: SagaContext) -> Any:
        what = f"step {spec.name!r} of saga {definition.name!r}"
        ctx = replace(ctx, input=apply_schema(spec.input_schema, ctx.input, f"input of {what}"))
        if spec.is_transform:
            value = spec.action(ctx)
        else:
            kwargs = call_arguments(spec.action, ctx, spec.args)
            value = run_with_timeout(lambda: spec.action(**kwargs), spec.timeout, what)
        return storable(apply_schema(spec.output_schema, value, f"output of {what}"))

    def _step_completed(
        self,
        definition: SagaDefinition,
        execution: ExecutionRecord,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        blob: bytes,
        step_advance: Advance,
        fields: dict[str, Any],
    ) -> None:
        target = definition.nodes[message.node]
        if not isinstance(target, ParallelNode):
            if forward.record_step_completed(
                self.db,
                execution_id=execution.id,
                name=spec.name,
                attempt=attempt,
                node=message.node,
                sub=message.sub,
                result_blob=blob,
                advance=step_advance,
                now=get_clock().now(),
            ):
                self.emit("saga-step-completed", fields)
                self._advanced(definition, execution.id, step_advance)
            return
        group = forward.record_step_settled(
            self.db,
            execution_id=execution.id,
            name=spec.name,
            attempt=attempt,
            node=message.node,
            sub=message.sub,
            members=[s.name for s in target.steps],
            committed=execution.committed_at is not None,
            compensations=compensations_of(definition),
            now=get_clock().now(),
            advance=step_advance,
            result_blob=blob,
        )
        if group is None:
            return
        self.emit("saga-step-completed", fields)
        if not group.settled:
            return
        if group.unwind is not None:
            self.unwinder.begin(definition, execution.id, group.unwind, group.failure_reason)
        else:
            self._advanced(definition, execution.id, step_advance)

    def _advanced(
        self, definition: SagaDefinition, execution_id: str, step_advance: Advance
    ) -> None:
        if step_advance.finished:
            self.emit("saga-completed", {"execution_id": execution_id, "saga": definition.name})
        else:
            self._publish_position(definition, execution_id, step_advance.node, step_advance.sub)

    # -- failures ---------------------------------------------------------------------
    def _step_failed(
        self,
        definition: SagaDefinition,
        execution: ExecutionRecord,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        error: Exception,
    ) -> None:
        reason = describe_error(error)
        fields = {
            "execution_id": execution.id,
            "saga": definition.name,
            "step": spec.name,
            "attempt": attempt,
            "error": reason,
        }
        # The same value would be refused again: no point retrying.
        deterministic = isinstance(error, (PayloadError, SchemaValidationError))
        if attempt < spec.retry and not deterministic:
            if forward.record_step_retry(
                self.db, execution_id=execution.id, name=spec.name, attempt=attempt, error=reason
            ):
                delay = backoff_delay(attempt, spec.backoff, spec.backoff_max, get_clock().random())
                self.emit("saga-step-retry", {**fields, "countdown": delay})
                self.publisher.publish_node(
                    definition.name, spec, replace(message, attempt=attempt + 1), countdown=delay
                )
            return
        target = definition.nodes[message.node]
        members = (
            [s.name for s in target.steps] if isinstance(target, ParallelNode) else [spec.name]
        )
        group = self._keep_cause(
            error,
            lambda: forward.record_step_settled(
                self.db,
                execution_id=execution.id,
                name=spec.name,
                attempt=attempt,
                node=message.node,
                sub=message.sub,
                members=members,
                committed=execution.committed_at is not None,
                compensations=compensations_of(definition),
                now=get_clock().now(),
                advance=Advance(message.node, message.sub, False, False),
                error=reason,
            ),
        )
        self.emit("saga-step-failed", fields)
        if group is not None and group.settled and group.unwind is not None:
            self.unwinder.begin(definition, execution.id, group.unwind, group.failure_reason)

    def _keep_cause(self, cause: Exception, write: Callable[[], T]) -> T:
        """Retry a store write that records ``cause``; if the store keeps refusing, raise
        ``cause`` itself, so the step's error is never replaced by the store's (guarantee 19)."""
        for delay in (*self.settings.store_retry_delays, None):
            try:
                return write()
            except SQLAlchemyError as store_error:
                logger.warning(
                    "store refused the failure record of %s: %s",
                    describe_error(cause),
                    describe_error(store_error),
                )
                if delay is None:
                    raise cause from store_error
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _fail_outside_step(
        self, definition: SagaDefinition, execution_id: str, reason: str
    ) -> None:
        execution, _ = queries.load_snapshot(self.db, execution_id)
        plan = forward.fail_execution(
            self.db,
            execution_id=execution_id,
            reason=reason,
            committed=execution is not None and execution.committed_at is not None,
            compensations=compensations_of(definition),
            now=get_clock().now(),
        )
        if plan is not None:
            self.unwinder.begin(definition, execution_id, plan, reason)

    def _definition_changed(self, definition: SagaDefinition, execution: ExecutionRecord) -> None:
        reason = (
            f"DefinitionChangedError: saga {definition.name!r} was deployed with structure "
            f"{definition.hash} while execution {execution.id!r} was running on "
            f"{execution.definition_hash}; it was not run against the new graph"
        )
        logger.error(reason)
        self._fail_outside_step(definition, execution.id, reason)

    def _refused(self, message: NodeMessage, verdict: Admission) -> None:
        logger.info("node message %s refused: %s", message, verdict.value)
        self.emit(
            "saga-message-refused",
            {"execution_id": message.execution_id, "node": message.node, "reason": verdict.value},
        )
