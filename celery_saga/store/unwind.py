"""Unwind-path writes: claims, outcomes, parking and the two operator exits."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, exists, func, literal, update

from celery_saga.decisions.unwind import (
    UnwindKind,
    UnwindStep,
    next_unwind_step,
)
from celery_saga.records import (
    Attempt,
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    StepRecord,
)
from celery_saga.store import claims, drivers, flow, history, prepared
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.directions import REVERSE, claimed
from celery_saga.store.history import Kind
from celery_saga.store.queries import bump_and_load, bump_run, load_steps
from celery_saga.store.tables import executions, step_records


def _step(execution_id: str, name: str) -> Any:
    return (step_records.c.execution_id == execution_id) & (step_records.c.name == name)


def _compensating() -> Any:
    return executions.c.state == ExecutionState.COMPENSATING.value


@functools.cache
def _reversal_claim(seen: bool, durable: bool) -> Any:
    """The checked path's claim of a reversal, built once per shape. Params: ``run_id``,
    ``step_name``, ``attempts_before``, ``now``, ``seen_lease`` (with ``seen``), ``lease``,
    ``reversal_holder``."""
    held_until = step_records.c.compensation_lease_expires_at
    lease_free = held_until.is_(None) | (held_until < prepared.param("now", held_until))
    if seen:
        lease_free |= held_until == prepared.param("seen_lease", held_until)
    if not durable:
        lease_free &= prepared.commit_without_flush_wait()
    return (
        update(step_records)
        .where(
            step_records.c.execution_id == prepared.param("run_id", step_records.c.execution_id),
            step_records.c.name == prepared.param("step_name", step_records.c.name),
            step_records.c.compensation_status.is_(None),
            step_records.c.compensation_attempts
            == prepared.param("attempts_before", step_records.c.compensation_attempts),
            lease_free,
            exists().where(prepared.compensating_run()),
        )
        .values(claimed_params())
    )


def claimed_params() -> dict[str, Any]:
    """What a reversal's claim sets, from the params ``lease`` and ``reversal_holder``."""
    lease = prepared.param("lease", REVERSE.lease)
    return claimed(REVERSE, lease, prepared.param("reversal_holder", REVERSE.holder))


def claim_compensation(
    db: Database,
    reversal: Attempt,
    *,
    lease_expires_at: datetime,
    now: datetime,
    holder: str | None = None,
    seen_lease: datetime | None = None,
    previous: StepRecord | None = None,
    restored_at: datetime | None = None,
) -> bool:
    """Claim attempt ``reversal.attempt`` of a reversal (the previous one is the latest
    recorded) while the run is compensating and the step has no outcome, and no live lease
    holds it but ``seen_lease`` (one whose holder said it no longer runs it). ``previous``:
    the record as read before; when an attempt held it under a lease, that attempt never
    settled, and its ``reversal-lost`` row is written with the claim. ``restored_at``: the
    holder writes back a claim the store lost (``decisions/lost_claims.py``); it waits for
    its flush, with its ``claim-restored`` history row."""
    params = {
        "run_id": reversal.execution_id,
        "step_name": reversal.name,
        "attempts_before": reversal.attempt - 1,
        "now": to_db_time(now),
        "seen_lease": None if seen_lease is None else to_db_time(seen_lease),
        "lease": to_db_time(lease_expires_at),
        "reversal_holder": holder,
    }
    durable = db.durable_claims or restored_at is not None
    statement = _reversal_claim(seen_lease is not None, durable)
    lost = previous is not None and previous.compensation_lease_expires_at is not None
    with db.transaction() if lost or restored_at else db.single_statement() as connection:
        if drivers.rowcount(connection, statement, params) != 1:
            return False
        restored = None
        if restored_at is not None:
            restored = history.claim_restored(reversal.name, holder, restored_at, reversal=True)
        claims.taken_over(
            REVERSE,
            connection,
            reversal.execution_id,
            reversal.attempt,
            lost=previous if lost else None,
            restored=restored,
            now=now,
        )
        return True


def _lock_compensating(
    connection: Connection, execution_id: str, now: datetime, **changes: Any
) -> ExecutionRecord:
    stamp = to_db_time(now)
    record = bump_and_load(connection, execution_id, _compensating(), updated_at=stamp, **changes)
    if record is None:
        raise Conflict(execution_id)
    return record


def _plan_and_finish(
    connection: Connection, record: ExecutionRecord, compensations: Collection[str], now: datetime
) -> UnwindStep:
    steps = load_steps(connection, record.id)
    plan = next_unwind_step(steps, record.committed_at is not None, compensations)
    if plan.kind is UnwindKind.DONE:
        assert plan.rollback_status is not None
        connection.execute(
            update(executions)
            .where(executions.c.id == record.id)
            .values(
                state=prepared.ending_state(literal(ExecutionState.FAILED.value)),
                rollback_status=plan.rollback_status.value,
                updated_at=to_db_time(now),
            )
        )
        history.write_unwind_closed(connection, record.id, plan.rollback_status, now)
        if record.flow_key is not None:
            flow.release(connection, record.id, now)
    elif plan.kind is not UnwindKind.COMPENSATE:
        assert plan.record is not None
        _park(connection, record.id, plan, now)
    return plan


def _park(connection: Connection, execution_id: str, plan: UnwindStep, now: datetime) -> None:
    assert plan.record is not None
    reason = plan.record.compensation_reason
    if plan.kind is UnwindKind.HALT_VANISHED:
        reason = (
            f"step {plan.record.name!r} owed a reversal but its compensation is no "
            "longer in the deployed definition"
        )
        connection.execute(
            update(step_records)
            .where(_step(execution_id, plan.record.name))
            .values(
                compensation_status=CompensationOutcome.FAILED.value,
                compensation_reason=reason,
                compensated_at=to_db_time(now),
                compensation_lease_expires_at=None,
            )
        )
    rollback_reason = f"reversal of step {plan.record.name!r} failed: {reason}"
    connection.execute(
        update(executions)
        .where(executions.c.id == execution_id)
        .values(
            state=ExecutionState.COMPENSATION_STUCK.value,
            rollback_status=RollbackStatus.STUCK.value,
            rollback_reason=rollback_reason,
            updated_at=to_db_time(now),
        )
    )
    history.write_parked(
        connection,
        execution_id,
        plan.record.name,
        plan.record.compensation_attempts,
        rollback_reason,
        now,
    )


def plan_unwind(
    db: Database, *, execution_id: str, compensations: Collection[str], now: datetime
) -> UnwindStep | None:
    """Decide (and apply, if it finishes or parks) the next move of a compensating run; an
    unwind it closes writes its ``unwind-closed`` row (a parked one its ``parked`` row)."""
    try:
        with db.transaction() as connection:
            record = _lock_compensating(connection, execution_id, now)
            return _plan_and_finish(connection, record, compensations, now)
    except Conflict:
        return None


def reopen_for_unwind(
    db: Database,
    *,
    execution_id: str,
    reason: str,
    compensations: Collection[str],
    now: datetime,
) -> UnwindStep | None:
    """Start the unwind of a run that is not compensating yet: a completed child whose
    parent is unwinding (unless it passed its pivot), or a run recorded failed before its
    unwind started. ``reason`` becomes its failure reason if it has none, and the detail of
    its ``unwind-begun`` history row. None: neither."""
    reopenable = (
        (executions.c.state == ExecutionState.COMPLETED.value) & executions.c.committed_at.is_(None)
    ) | (
        (executions.c.state == ExecutionState.FAILED.value) & executions.c.rollback_status.is_(None)
    )
    with db.transaction() as connection:
        record = bump_and_load(
            connection,
            execution_id,
            reopenable,
            state=ExecutionState.COMPENSATING.value,
            failure_reason=func.coalesce(executions.c.failure_reason, reason),
            updated_at=to_db_time(now),
        )
        if record is None:
            return None
        history.note(connection, execution_id, Kind.UNWIND_BEGUN, now, reason)
        return _plan_and_finish(connection, record, compensations, now)


def park_unwind(db: Database, *, execution_id: str, reason: str, now: datetime) -> bool:
    """Park a compensating run whose progress cannot be recorded (guarantee 20)."""
    with db.transaction() as connection:
        parked = bump_run(
            connection,
            execution_id,
            _compensating(),
            state=ExecutionState.COMPENSATION_STUCK.value,
            rollback_status=RollbackStatus.STUCK.value,
            rollback_reason=reason,
            updated_at=to_db_time(now),
        )
        if not parked:
            return False
        history.write_parked(connection, execution_id, None, None, reason, now)
        return True
