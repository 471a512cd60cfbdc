"""Moving a run forward: storing and launching runs, publishing a position, recording a
step's completion, and the owner's side of waits (signals and deadlines)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery_saga.decisions.admission import Admission, NodeMessage
from celery_saga.decisions.cursor import Advance, advance, first_position
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import BranchNode, ParallelNode, SubSagaNode, WaitNode
from celery_saga.errors import BranchPathError
from celery_saga.records import ExecutionState, StepAttempt, StepStatus
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.failures import StepFailures
from celery_saga.runtime.navigation import choose_path, route
from celery_saga.runtime.outcomes import NoBody
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.runtime.unwinder import compensations_of
from celery_saga.store import forward, joins, queries
from celery_saga.store.codec import pack

logger = logging.getLogger("celery_saga")


class Progress(StepFailures):
    # -- starting ---------------------------------------------------------------------
    def create(
        self,
        definition: SagaDefinition,
        saga_input: Any,
        execution_id: str,
        parent_execution_id: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Store a new run at its first position (one INSERT; a taken id raises
        ``IntegrityError``); ``timeout`` (else the saga's) sets its deadline."""
        blob = pack(
            saga_input,
            what=f"input of saga {definition.name!r}",
            limit=self.settings.max_payload_bytes,
        )
        first = first_position(definition.nodes)
        now = get_clock().now()
        seconds = timeout if timeout is not None else definition.timeout
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
            now=now,
            parent_execution_id=parent_execution_id,
            deadline_at=None if seconds is None else now + timedelta(seconds=seconds),
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
        target, version = definition.nodes[node], definition.hash
        message = NodeMessage(execution_id, node, sub, 0, 1)
        if isinstance(target, ParallelNode):
            for member, spec in enumerate(target.steps):
                message = NodeMessage(execution_id, node, 0, member, 1)
                self.publisher.publish_node(definition.name, spec, message, version=version)
            return
        if isinstance(target, WaitNode):
            label = f"{definition.name}.wait:{target.event}"
            self.publisher.publish_node(
                definition.name, None, message, label=label, version=version
            )
            return
        if isinstance(target, SubSagaNode):
            label = f"{definition.name}.{target.name}"
            self.publisher.publish_node(
                definition.name, None, message, label=label, version=version
            )
            return
        if isinstance(target, BranchNode):
            try:
                path = target.paths[choose_path(self.db, definition, target, execution_id, node)]
            except BranchPathError as error:
                self.fail_outside_step(definition, execution_id, describe_error(error))
                return
            self.publisher.publish_node(definition.name, path[sub], message, version=version)
            return
        self.publisher.publish_node(
            definition.name, route(target, sub, 0), message, version=version
        )

    def step_completed(
        self,
        definition: SagaDefinition,
        step: StepAttempt,
        blob: bytes,
        step_advance: Advance,
        fields: dict[str, Any],
    ) -> bool:
        """Record ``step`` completed and move the run on (a parallel member: join first);
        False: the claim was no longer ours, nothing was recorded. The result exists only
        in this process: its record is retried through store outages (guarantee 20) rather
        than left to a lease that would run the body again."""
        target = definition.nodes[step.node]
        if not isinstance(target, ParallelNode):
            if write_outcome(
                lambda: forward.record_step_completed(
                    self.db,
                    step,
                    result_blob=blob,
                    advance=step_advance,
                    now=get_clock().now(),
                ),
                budget=self.settings.outcome_retry_budget,
                what=f"the result of step {step.name!r} of execution {step.execution_id}",
                landed=lambda: self.landed(step, StepStatus.COMPLETED),
                if_landed=True,
                restore=lambda: self.restore_step(definition, step),
            ):
                self.emit("saga-step-completed", fields)
                self.advanced(definition, step.execution_id, step_advance)
                return True
            return False
        members = [s.name for s in target.steps]
        group = self.settle(definition, step, members, step_advance, result_blob=blob)
        if group is None:
            return False
        self.emit("saga-step-completed", fields)
        if not group.settled:
            return True
        if group.unwind is not None:
            self.unwinder.begin(definition, step.execution_id, group.unwind, group.failure_reason)
        else:
            self.advanced(definition, step.execution_id, step_advance)
        return True

    def rejoin(self, definition: SagaDefinition, message: NodeMessage) -> None:
        """A settled member's message came again while its run stands at the group: join the
        group if every member has settled (``joins.join_if_settled``), as its last member
        would have."""
        target = definition.nodes[message.node]
        assert isinstance(target, ParallelNode)
        name = target.steps[message.member].name
        step = StepAttempt(message.execution_id, name, message.node, message.sub, 0)
        onward = advance(definition.nodes, message.node, message.sub, 1)
        group = joins.join_if_settled(
            self.db,
            step,
            group=target.name,
            members=[s.name for s in target.steps],
            compensations=compensations_of(definition),
            now=get_clock().now(),
            advance=onward,
        )
        if group is None or not group.settled:
            return
        logger.warning("execution %s: group %r joined late", message.execution_id, target.name)
        if group.unwind is not None:
            self.unwinder.begin(definition, step.execution_id, group.unwind, group.failure_reason)
        else:
            self.advanced(definition, step.execution_id, onward)

    def advanced(
        self, definition: SagaDefinition, execution_id: str, step_advance: Advance
    ) -> None:
        """The run moved to ``step_advance`` (committed): publish it, or report the end."""
        if step_advance.finished:
            self.emit("saga-completed", {"execution_id": execution_id, "saga": definition.name})
            self.unwinder.settled(definition, execution_id)
        else:
            self.publish_position(definition, execution_id, step_advance.node, step_advance.sub)

    def pass_position(self, definition: SagaDefinition, message: NodeMessage) -> NoBody:
        """Nothing runs at this position (a loop or ``for_each`` ended, or had nothing to
        run): move past the node."""
        onward = advance(definition.nodes, message.node, 0)
        if forward.pass_position(
            self.db,
            execution_id=message.execution_id,
            node=message.node,
            sub=message.sub,
            advance=onward,
            now=get_clock().now(),
        ):
            passed: dict[str, Any] = {
                "execution_id": message.execution_id,
                "saga": definition.name,
                "node": message.node,
                "sub": message.sub,
                "version": definition.hash,
            }
            self.emit("saga-node-passed", passed)
            self.advanced(definition, message.execution_id, onward)
            return NoBody("nothing runs at this position")
        return self.refused(message, Admission.REJECT_STALE_CURSOR)

    def refused(self, message: NodeMessage, verdict: Admission) -> NoBody:
        logger.info("node message %s refused: %s", message, verdict.value)
        self.emit(
            "saga-message-refused",
            {"execution_id": message.execution_id, "node": message.node, "reason": verdict.value},
        )
        return NoBody(verdict.value)
