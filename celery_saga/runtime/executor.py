"""Forward execution of one node message: admit, run the body, record, publish the next."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

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
from celery_saga.records import ExecutionRecord, ExecutionState, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.invoke import invoke_step, step_context
from celery_saga.runtime.keys import idempotency_key
from celery_saga.runtime.navigation import node_at, resolve
from celery_saga.runtime.ports import EventSink, Publisher, RuntimeParts, Settings
from celery_saga.runtime.store_retry import keep_cause
from celery_saga.runtime.unwinder import Unwinder, compensations_of
from celery_saga.store import forward, queries
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")


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
        self.publish_position(definition, execution_id, first.node, 0)

    # -- publishing -------------------------------------------------------------------
    def publish_position(
        self, definition: SagaDefinition, execution_id: str, node: int, sub: int
    ) -> None:
        target = definition.nodes[node]
        if isinstance(target, ParallelNode):
            for member, spec in enumerate(target.steps):
                message = NodeMessage(execution_id, node, 0, member, 1)
                self.publisher.publish_node(definition.name, spec, message)
            return
        try:
            spec, _ = resolve(self.db, definition, execution_id, node, sub, 0)
        except BranchPathError as error:
            self._fail_outside_step(definition, execution_id, describe_error(error))
            return
        self.publisher.publish_node(
            definition.name, spec, NodeMessage(execution_id, node, sub, 0, 1)
        )

    # -- running a node ---------------------------------------------------------------
    def run_node(
        self, message: NodeMessage, saga_name: str | None = None, redelivered: bool = False
    ) -> None:
        """Handle one node message.

        Fast path (first delivery of a first attempt): claim straight away; the claim's
        WHERE clause is the admission predicate (live run, this position, deployed graph,
        no START record yet). Anything else, or a refused claim, takes the checked path: read
        the run and let ``decide_admission`` say what to do.
        """
        definition = self.registry(saga_name) if saga_name else None
        if definition is not None and message.attempt == 1 and not redelivered:
            target = node_at(definition, message)
            if target is not None and not isinstance(target, BranchNode):
                spec, _ = resolve(
                    self.db, definition, message.execution_id, message.node, 0, message.member
                )
                attempt = self._claim(definition, spec, message, None)
                if attempt is not None:
                    self._run_claimed(definition, spec, message, attempt, 1, None)
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
            self._refused(message, verdict)
            return
        try:
            spec, path_length = resolve(
                self.db, definition, execution.id, message.node, message.sub, message.member
            )
        except BranchPathError as error:
            self._fail_outside_step(definition, execution.id, describe_error(error))
            return
        record = next((s for s in steps if s.name == spec.name), None)
        verdict = decide_admission(execution, record, message, deployed, now)
        if verdict is Admission.REJECT_IN_FLIGHT and redelivered and record:
            assert record.lease_expires_at is not None
            wait = (record.lease_expires_at - now).total_seconds() + 1
            self.publisher.publish_node(definition.name, spec, message, countdown=wait)
            return
        if verdict is not Admission.RUN:
            self._refused(message, verdict)
            return
        attempt = self._claim(definition, spec, message, record)
        if attempt is None:
            self._refused(message, Admission.REJECT_IN_FLIGHT)
            return
        self._run_claimed(definition, spec, message, attempt, path_length, snapshot)

    def _claim(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        record: StepRecord | None,
    ) -> int | None:
        now = get_clock().now()
        lease = (
            spec.timeout + self.settings.lease_margin
            if spec.timeout
            else self.settings.lease_seconds
        )
        return forward.claim_step(
            self.db,
            execution_id=message.execution_id,
            name=spec.name,
            node=message.node,
            sub=message.sub,
            definition_hash=definition.hash,
            idempotency_key=idempotency_key(message.execution_id, spec.name, 0, "forward"),
            compensatable=spec.compensatable,
            lease_expires_at=now + timedelta(seconds=lease),
            now=now,
            existing=record,
        )

    def _run_claimed(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        path_length: int,
        snapshot: tuple[ExecutionRecord | None, list[StepRecord]] | None,
    ) -> None:
        execution_id = message.execution_id
        key = idempotency_key(execution_id, spec.name, 0, "forward")
        fields = {
            "execution_id": execution_id,
            "saga": definition.name,
            "step": spec.name,
            "attempt": attempt,
            "idempotency_key": key,
        }
        self.emit("saga-step-started", fields)
        try:
            ctx = step_context(self.db, definition.name, spec, execution_id, key, attempt, snapshot)
        except SQLAlchemyError:
            raise  # the store failed, not the step: the claim waits for its lease or a retry
        except Exception as error:
            self._step_failed(definition, spec, message, attempt, error)
            return
        try:
            blob = pack(
                invoke_step(definition.name, spec, ctx),
                what=f"result of step {spec.name!r} of saga {definition.name!r}",
                limit=self.settings.max_payload_bytes,
            )
        except Exception as error:
            # Everything the step does counts as its attempt: an error here must settle it,
            # or the run would wait for its lease to expire.
            self._step_failed(definition, spec, message, attempt, error)
            return
        step_advance = advance(definition.nodes, message.node, message.sub, path_length)
        self._step_completed(definition, spec, message, attempt, blob, step_advance, fields)

    def _step_completed(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        blob: bytes,
        step_advance: Advance,
        fields: dict[str, Any],
    ) -> None:
        target = definition.nodes[message.node]
        if not isinstance(target, ParallelNode):
            # The result exists only in this process now: retry its record here rather than
            # let the run wait for the lease to expire and the body to run again.
            if keep_cause(
                self.settings.store_retry_delays,
                None,
                lambda: forward.record_step_completed(
                    self.db,
                    execution_id=message.execution_id,
                    name=spec.name,
                    attempt=attempt,
                    node=message.node,
                    sub=message.sub,
                    result_blob=blob,
                    advance=step_advance,
                    now=get_clock().now(),
                ),
            ):
                self.emit("saga-step-completed", fields)
                self._advanced(definition, message.execution_id, step_advance)
            return
        group = forward.record_step_settled(
            self.db,
            execution_id=message.execution_id,
            name=spec.name,
            attempt=attempt,
            node=message.node,
            sub=message.sub,
            members=[s.name for s in target.steps],
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
            self.unwinder.begin(
                definition, message.execution_id, group.unwind, group.failure_reason
            )
        else:
            self._advanced(definition, message.execution_id, step_advance)

    def _advanced(
        self, definition: SagaDefinition, execution_id: str, step_advance: Advance
    ) -> None:
        if step_advance.finished:
            self.emit("saga-completed", {"execution_id": execution_id, "saga": definition.name})
        else:
            self.publish_position(definition, execution_id, step_advance.node, step_advance.sub)

    # -- failures ---------------------------------------------------------------------
    def _step_failed(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        error: Exception,
    ) -> None:
        reason = describe_error(error)
        fields = {
            "execution_id": message.execution_id,
            "saga": definition.name,
            "step": spec.name,
            "attempt": attempt,
            "idempotency_key": idempotency_key(message.execution_id, spec.name, 0, "forward"),
            "error": reason,
        }
        # The same value would be refused again: no point retrying.
        deterministic = isinstance(error, (PayloadError, SchemaValidationError))
        final = attempt >= spec.retry or deterministic
        logger.log(
            logging.ERROR if final else logging.WARNING,
            "saga %r execution %s: step %r attempt %d failed: %s",
            definition.name,
            message.execution_id,
            spec.name,
            attempt,
            reason,
            exc_info=error,
        )
        if not final:
            self._schedule_retry(definition, spec, message, attempt, reason, fields)
            return
        target = definition.nodes[message.node]
        members = (
            [s.name for s in target.steps] if isinstance(target, ParallelNode) else [spec.name]
        )
        group = keep_cause(
            self.settings.store_retry_delays,
            error,
            lambda: forward.record_step_settled(
                self.db,
                execution_id=message.execution_id,
                name=spec.name,
                attempt=attempt,
                node=message.node,
                sub=message.sub,
                members=members,
                compensations=compensations_of(definition),
                now=get_clock().now(),
                advance=Advance(message.node, message.sub, False, False),
                error=reason,
            ),
        )
        self.emit("saga-step-failed", fields)
        if group is not None and group.settled and group.unwind is not None:
            self.unwinder.begin(
                definition, message.execution_id, group.unwind, group.failure_reason
            )

    def _schedule_retry(
        self,
        definition: SagaDefinition,
        spec: StepSpec,
        message: NodeMessage,
        attempt: int,
        reason: str,
        fields: dict[str, Any],
    ) -> None:
        """Release the claim and publish the next attempt with a countdown (no slot held)."""
        if forward.record_step_retry(
            self.db,
            execution_id=message.execution_id,
            name=spec.name,
            attempt=attempt,
            error=reason,
        ):
            delay = backoff_delay(attempt, spec.backoff, spec.backoff_max, get_clock().random())
            self.emit("saga-step-retry", {**fields, "countdown": delay})
            self.publisher.publish_node(
                definition.name, spec, replace(message, attempt=attempt + 1), countdown=delay
            )

    def _fail_outside_step(
        self, definition: SagaDefinition, execution_id: str, reason: str
    ) -> None:
        plan = forward.fail_execution(
            self.db,
            execution_id=execution_id,
            reason=reason,
            compensations=compensations_of(definition),
            now=get_clock().now(),
        )
        if plan is None:
            logger.info(
                "execution %s not failed now (%s): not live, or a step is in flight",
                execution_id,
                reason,
            )
        else:
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
