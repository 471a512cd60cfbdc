"""Writing back a claim the store lost, from its live holder (guarantee 30).

A database server crash, or a failover to a replica that never received them, undoes the
last commits: a claim among them is gone while its body runs on. ``decisions/lost_claims.py``
tells that apart from a takeover or an ended attempt; here the record is read, and a lost
claim is written back (a compare-and-set on what was read, waiting for its WAL flush, with
its ``claim-restored`` history row) with one log line. The heartbeat asks when a renewal
matches nothing, and an outcome write asks before it gives its record up: the step is then
recorded as its holder ran it, and never run a second time for want of a claim.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery_saga.decisions.lost_claims import ClaimFound, ClaimState, claim_state
from celery_saga.records import (
    Attempt,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
    StepStatus,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.keys import record_key
from celery_saga.store import forward, queries, unwind
from celery_saga.store.database import Database

logger = logging.getLogger("celery_saga")


class LostClaims:
    """Reads, decides and writes back, for the claims this process holds."""

    def __init__(self, db: Database, lease_seconds: float) -> None:
        self.db = db
        self.lease = timedelta(seconds=lease_seconds)

    def step(self, step: Attempt, compensatable: bool | None) -> ClaimState:
        """The state of ``step``'s claim; a lost one is written back (``RESTORED``), unless
        what the claim stored (``compensatable``, its holder) is unknown here: ``LOST``."""
        execution, record = self._read(step.execution_id, step.name)
        found = _step_found(execution, record, step, compensatable is not None)
        state = claim_state(found, step.attempt, step.holder)
        if state is not ClaimState.LOST or execution is None:
            return state
        if compensatable is None or step.holder is None:
            return state  # not known here: the body's own heartbeat writes it back
        now = get_clock().now()
        claimed = forward.claim_step(
            self.db,
            execution_id=step.execution_id,
            name=step.name,
            node=step.node,
            sub=step.sub,
            definition_hash=execution.definition_hash,
            idempotency_key=record_key(step.execution_id, step.name, "forward"),
            compensatable=compensatable,
            lease_expires_at=now + self.lease,
            now=step.claimed_at or now,
            existing=record,
            holder=step.holder,
            restored_at=now,
        )
        if claimed != step.attempt:  # claimed by another since it was read
            execution, record = self._read(step.execution_id, step.name)
            return claim_state(_step_found(execution, record, step), step.attempt, step.holder)
        _restored("step", step.execution_id, step.name, step.attempt, step.holder)
        return ClaimState.RESTORED

    def reversal(self, reversal: Attempt) -> ClaimState:
        """``step`` for a reversal's claim."""
        execution, record = self._read(reversal.execution_id, reversal.name)
        found = _reversal_found(execution, record)
        state = claim_state(found, reversal.attempt, reversal.holder)
        if state is not ClaimState.LOST or record is None or reversal.holder is None:
            return state
        now = get_clock().now()
        if not unwind.claim_compensation(
            self.db,
            reversal,
            lease_expires_at=now + self.lease,
            now=now,
            holder=reversal.holder,
            seen_lease=record.compensation_lease_expires_at,
            previous=record,
            restored_at=now,
        ):
            execution, record = self._read(reversal.execution_id, reversal.name)
            found = _reversal_found(execution, record)
            return claim_state(found, reversal.attempt, reversal.holder)
        what = "reversal of step"
        _restored(what, reversal.execution_id, reversal.name, reversal.attempt, reversal.holder)
        return ClaimState.RESTORED

    def _read(
        self, execution_id: str, name: str
    ) -> tuple[ExecutionRecord | None, StepRecord | None]:
        execution, steps = queries.load_run_with_step(self.db, execution_id, name)
        return execution, next((s for s in steps if s.name == name), None)


def _step_found(
    execution: ExecutionRecord | None,
    record: StepRecord | None,
    step: Attempt,
    placed: bool = True,
) -> ClaimFound:
    """``placed``: the attempt knows its position (not so when a worker's main process asks
    about it: its node and sub are 0 there, and with no record the run being live is all
    that can be told)."""
    here = (step.node, step.sub) if record is None else (record.node, record.sub)
    owed = (
        execution is not None
        and execution.state is ExecutionState.RUNNING
        and ((record is None and not placed) or (execution.cursor, execution.cursor_sub) == here)
    )
    if record is None:
        return ClaimFound(attempts=0, holder=None, running=False, open=True, owed=owed)
    running = record.status is StepStatus.RUNNING
    return ClaimFound(
        attempts=record.attempts,
        holder=record.holder,
        running=running,
        open=running or record.status is StepStatus.PENDING,
        owed=owed,
    )


def _reversal_found(execution: ExecutionRecord | None, record: StepRecord | None) -> ClaimFound:
    owed = execution is not None and execution.state is ExecutionState.COMPENSATING
    if record is None:
        return ClaimFound(attempts=0, holder=None, running=False, open=False, owed=owed)
    open_ = record.compensation_status is None
    return ClaimFound(
        attempts=record.compensation_attempts,
        holder=record.compensation_holder,
        running=open_ and record.compensation_lease_expires_at is not None,
        open=open_,
        owed=owed,
    )


def _restored(what: str, execution_id: str, name: str, attempt: int, holder: str | None) -> None:
    logger.warning(
        "execution %s: the store lost the claim of %s %r attempt %d (a database crash or "
        "failover undid its commit); its holder %s, still running it, wrote it back",
        execution_id,
        what,
        name,
        attempt,
        holder,
    )
