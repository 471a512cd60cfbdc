"""The recovery sweep: republish what lost messages left unfinished (run by beat and at worker
start-up; safe to run from several processes at once)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import NamedTuple

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.recovery import (
    Recovery,
    RecoveryKind,
    claim_missing,
    decide_recovery,
    left_to_running,
    waited_on_child,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import ParallelNode
from celery_saga.records import ExecutionRecord, StepRecord
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.executor import Executor
from celery_saga.runtime.moves import (
    ContinueCancel,
    FollowUnwind,
    Move,
    PublishNode,
    PublishPosition,
    next_reversal,
    then,
)
from celery_saga.runtime.process_name import process_name
from celery_saga.store import queries, recovery, unwind, versions
from celery_saga.store.transient import retry_transient
from celery_saga.tracing.carry import carrying

logger = logging.getLogger("celery_saga")


class _Planned(NamedTuple):
    definition: SagaDefinition
    execution: ExecutionRecord
    steps: list[StepRecord]
    action: Recovery
    child: ExecutionRecord | None


class Recoverer:
    """Finds what lost messages left unfinished and returns, for each run, the move that
    carries it on; ``carry_out`` (the executor's interpreter) does it."""

    def __init__(self, executor: Executor) -> None:
        self.parts, self.carry_out = executor.parts, executor.carry_out
        self.step_flow = executor.step_flow

    def sweep(
        self,
        stale_after: timedelta,
        page: int = 200,
        most: int = 10_000,
        actor: str | None = None,
    ) -> int:
        """Republish for every run idle for ``stale_after``; returns how many were acted on.
        ``actor``: the operator who ran this sweep (``saga recover``), named in each run's
        ``recovered`` history row.

        Pages through every idle run (runs left alone, e.g. with a step in flight, must not
        hide the ones behind them), at most ``most`` per sweep; one run that cannot be
        handled is logged and skipped. Nothing is sent again while the store has been up
        for less than ``stale_after``, nor for a run a worker says it still runs: a crash
        may have lost claims whose bodies run on, and their holders write them back.
        """
        db = self.parts.db
        if self._store_just_started(stale_after):
            return 0
        now = get_clock().now()
        try:  # the lines at limited steps' doors, whose runs the sweep leaves to them
            self.carry_out(self.step_flow.sweep_lines(now, stale_after))
        except Exception:
            logger.exception("the pass of the lines at limited steps' doors failed")
        acted = seen = 0
        after = None
        while seen < most:
            rows = recovery.list_stale(db, cutoff=now - stale_after, limit=page, after=after)
            acted += self._recover_page([i for _, i in rows], now, stale_after, actor)
            seen += len(rows)
            if len(rows) < page:
                break
            after = rows[-1]
        return acted

    def _store_just_started(self, stale_after: timedelta) -> bool:
        up = recovery.seconds_since_start(self.parts.db)
        if up is None or up >= stale_after.total_seconds():
            return False
        logger.info(
            "the saga store started %.0f s ago: recovery waits until it has been up for "
            "saga_recover_after (%.0f s), so that workers still running bodies write back "
            "the claims a crash may have lost",
            up,
            stale_after.total_seconds(),
        )
        return True

    def _recover_page(
        self,
        execution_ids: list[str],
        now: datetime,
        stale_after: timedelta,
        actor: str | None = None,
    ) -> int:
        planned = []
        for execution_id in execution_ids:
            try:
                found = self._plan(execution_id, now, stale_after)
            except Exception:
                logger.exception("recovery of execution %s failed", execution_id)
                continue
            if found is not None:
                planned.append(found)
        # Only a run whose claim is missing from the store may be left to a worker: only
        # those are asked about (the question waits for the workers' answers).
        asked = {p.execution.id for p in planned if claim_missing(p.execution, p.steps, p.action)}
        running = self._running(sorted(asked))
        acted = 0
        for found in planned:
            if running is None and found.execution.id in asked:
                continue  # unknown whether a worker still runs it: the next sweep asks again
            holders = (running or {}).get(found.execution.id, set())
            if left_to_running(found.execution, found.steps, found.action, holders):
                logger.info(
                    "execution %s: not recovered, %s still runs it (a claim the store lost is "
                    "written back by its holder)",
                    found.execution.id,
                    ", ".join(sorted(holders)),
                )
                continue
            try:
                acted += self._act(found, now, stale_after, actor)
            except Exception:
                logger.exception("recovery of execution %s failed", found.execution.id)
        return acted

    def _running(self, execution_ids: list[str]) -> dict[str, set[str]] | None:
        """The runs among these that workers still run -> the holders running them; None
        when the workers could not be asked (said once)."""
        if not execution_ids:
            return {}
        running = self.parts.holders.running(execution_ids)
        if running is None:
            logger.warning(
                "%d run(s) not recovered now: the workers could not be asked whether they "
                "still run them; the next sweep tries again",
                len(execution_ids),
            )
        return running

    def owe_message(self, execution_id: str, error: Exception) -> None:
        """The broker refused a message whose transition is recorded: mark the run so the
        timer sweep sends it once the broker is back (seconds, not ``recover_after``)."""
        db = self.parts.db
        try:
            retry_transient(
                lambda: recovery.mark_message_owed(
                    db, execution_id=execution_id, now=get_clock().now()
                ),
                budget=self.parts.settings.store_retry_budget,
                what=f"marking execution {execution_id} as owed a message",
            )
        except Exception:
            logger.error(
                "execution %s: a message could not be sent (%s) nor marked as owed; the "
                "recovery sweep will send it after saga_recover_after",
                execution_id,
                describe_error(error),
            )
            return
        logger.warning(
            "execution %s: a message could not be sent (%s); the timer sweep will send it "
            "when the broker is reachable",
            execution_id,
            describe_error(error),
        )

    def send_owed(self, page: int = 200) -> int:
        """Send the next message of every run marked as owed one; returns how many."""
        db = self.parts.db
        now = get_clock().now()
        acted = 0
        for execution_id, version in recovery.list_owed(db, now=now, limit=page):
            execution, steps = queries.load_snapshot(db, execution_id)
            definition = self._version_of(execution) if execution else None
            if execution is None or definition is None:
                continue  # the owed message is left for a process that has the version
            if not recovery.claim_owed(
                db, execution_id=execution_id, seen_version=version, now=now
            ):
                continue
            action = decide_recovery(execution, steps, definition.reversible, now, timedelta(0))
            if action.kind in (RecoveryKind.NOTHING, RecoveryKind.RECOVER_CHILD):
                continue
            logger.info(
                "sending the owed message of execution %s: %s", execution_id, action.kind.value
            )
            with carrying(execution.trace_context):
                node, sub = execution.cursor, execution.cursor_sub
                self.carry_out(self._move(definition, execution_id, node, sub, action))
            acted += 1
        return acted

    def _plan(self, execution_id: str, now: datetime, stale_after: timedelta) -> _Planned | None:
        """What the sweep would do with one run (None: nothing)."""
        db = self.parts.db
        execution, steps = queries.load_snapshot(db, execution_id)
        definition = self._version_of(execution) if execution else None
        if execution is None or definition is None:
            return None
        holder = waited_on_child(execution, steps, definition.reversible)
        child = None
        if holder is not None and holder.child_execution_id is not None:
            child = queries.load_execution(db, holder.child_execution_id)
        action = decide_recovery(execution, steps, definition.reversible, now, stale_after, child)
        if action.kind is RecoveryKind.NOTHING:
            return None
        return _Planned(definition, execution, steps, action, child)

    def _recover_one(
        self, execution_id: str, now: datetime, stale_after: timedelta, actor: str | None
    ) -> int:
        """Recover one run (a child, through its parent's recovery)."""
        return self._recover_page([execution_id], now, stale_after, actor)

    def _act(
        self, planned: _Planned, now: datetime, stale_after: timedelta, actor: str | None
    ) -> int:
        """Carry out what ``_plan`` decided; a run waiting on its child recovers the child
        instead (a child is driven through its parent, never on its own)."""
        definition, execution, _, action, child = planned
        execution_id = execution.id
        if not recovery.claim_stale(
            self.parts.db,
            execution_id=execution_id,
            seen_version=execution.version,
            now=now,
            action=action.kind.value,
            actor=actor,
        ):
            return 0
        if action.kind is RecoveryKind.RECOVER_CHILD and child is not None:
            return self._recover_one(child.id, now, stale_after, actor)
        logger.warning("recovering execution %s: %s", execution_id, action.kind.value)
        self.parts.emit(
            "saga-recovered",
            {"execution_id": execution_id, "saga": definition.name, "action": action.kind.value},
        )
        node, sub = execution.cursor, execution.cursor_sub
        with carrying(execution.trace_context):  # what it sends stays in the run's trace
            self.carry_out(self._move(definition, execution_id, node, sub, action))
        return 1

    def _version_of(self, execution: ExecutionRecord) -> SagaDefinition | None:
        """The run's own version, or None (logged, and the run marked as waiting for it):
        a sweep never handles a run with another version; the sweep of a process that has
        it recovers the run."""
        found = self.parts.registry.known(execution.saga_name, execution.definition_hash)
        if found is None:
            logger.warning(
                "execution %s runs version %s of saga %r, which this process does not have; "
                "left for a worker that has it",
                execution.id,
                execution.definition_hash,
                execution.saga_name,
            )
            versions.mark_waiting(
                self.parts.db,
                execution_id=execution.id,
                definition_hash=execution.definition_hash,
                handed_back_by=process_name(),
                now=get_clock().now(),
            )
        return found

    def _move(
        self, definition: SagaDefinition, execution_id: str, node: int, sub: int, action: Recovery
    ) -> Move:
        """What carries the run on, as the sweep decided (``action``)."""
        if action.kind is RecoveryKind.CONTINUE_CANCEL:
            return ContinueCancel(definition, execution_id)
        if action.kind is RecoveryKind.REPUBLISH_POSITION:
            target = definition.nodes[node]
            members = target.steps if isinstance(target, ParallelNode) else ()
            retries = []
            for name, attempt in action.retries:
                member = next((i for i, s in enumerate(members) if s.name == name), 0)
                message = NodeMessage(execution_id, node, sub, member, attempt)
                retries.append(PublishNode(definition, message, spec=definition.find_step(name)))
            return then(PublishPosition(definition, execution_id, node, sub), *retries)
        if action.kind is RecoveryKind.REPUBLISH_COMPENSATION and action.record is not None:
            return next_reversal(definition, execution_id, action.record)
        db, now = self.parts.db, get_clock().now()
        if action.kind is RecoveryKind.REOPEN_UNWIND:
            plan = unwind.reopen_for_unwind(
                db,
                execution_id=execution_id,
                reason="recorded failed before its unwind started",
                compensations=definition.reversible,
                now=now,
            )
        else:
            plan = unwind.plan_unwind(
                db, execution_id=execution_id, compensations=definition.reversible, now=now
            )
        return FollowUnwind(definition, execution_id, plan)
