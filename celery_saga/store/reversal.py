"""A reversal's two writes: its claim and its outcome, each one statement on PostgreSQL
(on SQLite, the same guarded write, then the read of what it claimed).

The claim of a first delivery is guarded by the unwind's admission rule itself (the run is
compensating, this step is the latest started one still owed a reversal, no claim on it)
and returns what the worker needs, so it reads nothing else: the run with all its steps
when the compensation is given the saga's input or results, otherwise just the two step
records that decide the next move (the claimed one and the latest one started before it
that is still owed something; every step started after it is settled, or the claim would
have been refused). The outcome carries the unwind's next move, decided beforehand from
what the claim returned (``next_after_outcome``): settling the step, bumping the run and
closing or parking it are one write.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, exists, or_, select, update
from sqlalchemy.orm import aliased

from celery_saga.decisions.unwind import UnwindKind, UnwindStep, next_after_outcome
from celery_saga.records import (
    Attempt,
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    StepRecord,
)
from celery_saga.store import attempts, drivers, flow, history, prepared, unwind
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.directions import REVERSE, held_params
from celery_saga.store.forward import prefixed
from celery_saga.store.history import Kind
from celery_saga.store.queries import snapshot_from_rows, snapshot_query
from celery_saga.store.rows import step_from_row
from celery_saga.store.tables import executions, step_records


@dataclass(frozen=True)
class Unwinding:
    """The run as a reversal's claim found it. ``run``: its row, None when the claim did
    not read it (the compensation needs neither input nor results); ``steps``: all its
    step records, or only those that decide the next move, in start order."""

    run: ExecutionRecord | None
    steps: list[StepRecord]

    @property
    def committed(self) -> bool:
        """Whether the run passed its pivot (a lean claim is only granted before it)."""
        return self.run is not None and self.run.committed_at is not None


_later = aliased(step_records)


def _next_owed() -> Any:
    """This step is the one the unwind reverses now (``next_unwind_step`` as a predicate):
    eligible, without outcome, and every eligible step started after it is settled."""
    owed_later = select(_later.c.id).where(
        _later.c.execution_id == step_records.c.execution_id,
        _later.c.compensatable.is_(True),
        _later.c.id > step_records.c.id,
        or_(
            _later.c.compensation_status.is_(None),
            _later.c.compensation_status == CompensationOutcome.FAILED.value,
        ),
    )
    run_unwinding = select(executions.c.id).where(
        executions.c.id == step_records.c.execution_id,
        executions.c.state == ExecutionState.COMPENSATING.value,
        executions.c.committed_at.is_(None),
    )
    return (
        (step_records.c.execution_id == prepared.param("run_id", step_records.c.execution_id))
        & (step_records.c.name == prepared.param("step_name", step_records.c.name))
        & step_records.c.compensatable.is_(True)
        & step_records.c.child_execution_id.is_(None)
        & step_records.c.compensation_status.is_(None)
        & (
            step_records.c.compensation_attempts
            == prepared.param("attempts_before", step_records.c.compensation_attempts)
        )
        & step_records.c.compensation_lease_expires_at.is_(None)
        & exists(run_unwinding)
        & ~exists(owed_later)
    )


def _claim(durable: bool) -> Any:
    """The claim itself: it changes one row (the claimed record) or none (refused)."""
    guard = _next_owed()
    if not durable:
        guard &= prepared.commit_without_flush_wait()
    return update(step_records).where(guard).values(unwind.claimed_params())


def _lean_read(claimed_id: Any) -> Any:
    """The claimed record (no outcome yet) and the latest one before it still owed one."""
    return (
        select(step_records)
        .where(
            step_records.c.execution_id == prepared.param("run_id", step_records.c.execution_id),
            step_records.c.compensatable.is_(True),
            step_records.c.id <= claimed_id,
            or_(
                step_records.c.compensation_status.is_(None),
                step_records.c.compensation_status == CompensationOutcome.FAILED.value,
            ),
        )
        .order_by(step_records.c.id.desc())
        .limit(2)
    )


@functools.cache
def _claim_returning(with_run: bool, durable: bool) -> Any:
    """The claim and what it returns, in one statement (PostgreSQL); either read is the
    statement's own snapshot, in which the claimed row shows its state before the claim."""
    claimed = _claim(durable).returning(step_records.c.id).cte("claimed")
    if with_run:
        return snapshot_query(prepared.param("run_id", executions.c.id)).where(
            exists(select(claimed.c.id))
        )
    return _lean_read(select(claimed.c.id).scalar_subquery())


_mine = aliased(step_records)


@functools.cache
def _claim_then_read(with_run: bool) -> tuple[Any, Any]:
    """SQLite's claim and the read of what it claimed."""
    if with_run:
        return _claim(durable=True), snapshot_query(prepared.param("run_id", executions.c.id))
    claimed_id = select(_mine.c.id).where(
        _mine.c.execution_id == prepared.param("run_id", _mine.c.execution_id),
        _mine.c.name == prepared.param("step_name", _mine.c.name),
    )
    return _claim(durable=True), _lean_read(claimed_id.scalar_subquery())


def _claimed_rows(
    db: Database, with_run: bool, params: dict[str, Any]
) -> Sequence[Mapping[Any, Any]] | None:
    """The claim's rows (none: refused); None where the store has no such claim.

    On SQLite the two records of a lean claim are read in the claim's transaction, which
    holds the database's write lock from its BEGIN IMMEDIATE. The whole run is read after
    the claim has committed, without that lock: a run of thousands of steps would hold
    every other writer for as long as its rows take to decode. What the claim changed is
    the claimed record's attempt, lease and holder, which the caller sets itself, and while
    the claim is held no one else changes the run's steps."""
    if db.dialect == "postgresql":
        with db.single_statement() as connection:
            return drivers.rows(connection, _claim_returning(with_run, db.durable_claims), params)
    if db.dialect != "sqlite":  # MySQL refuses an UPDATE whose WHERE reads its own table
        return None
    claim, read = _claim_then_read(with_run)
    if not with_run:
        with db.transaction() as connection:
            if drivers.rowcount(connection, claim, params) != 1:
                return []
            return drivers.rows(connection, read, params)
    with db.single_statement() as connection:
        if drivers.rowcount(connection, claim, params) != 1:
            return []
    with db.single_statement() as connection:
        return drivers.rows(connection, read, params)


def claim_next_reversal(
    db: Database,
    reversal: Attempt,
    *,
    lease_expires_at: datetime,
    with_run: bool,
    holder: str | None = None,
) -> Unwinding | None:
    """Claim ``reversal`` if it is the unwind's next move, returning the run as of the
    claim (``with_run``: its row and all its steps; otherwise the steps that decide the
    next move); None: not ours, or not on this store (read and decide).

    One statement on PostgreSQL; on SQLite the claim, then the read (see
    ``_claimed_rows``); on MySQL and its kin the checked path reads, then claims."""
    params = {
        "run_id": reversal.execution_id,
        "step_name": reversal.name,
        "attempts_before": reversal.attempt - 1,
        "lease": to_db_time(lease_expires_at),
        "reversal_holder": holder,
    }
    rows = _claimed_rows(db, with_run, params)
    if rows is None:
        return None
    if with_run:
        execution, steps = snapshot_from_rows(rows)
        if execution is None:
            return None
    else:
        execution, steps = None, [step_from_row(row) for row in reversed(rows)]
        if not steps:
            return None
    claimed = [
        replace(
            s,
            compensation_attempts=reversal.attempt,
            compensation_lease_expires_at=lease_expires_at,
            compensation_holder=holder,
        )
        if s.name == reversal.name
        else s
        for s in steps
    ]
    return Unwinding(execution, claimed)


def _run_changes(plan: UnwindStep, name: str, reason: str | None) -> dict[str, Any]:
    """The run-row columns the next move changes: closed, parked, or none."""
    if plan.kind is UnwindKind.DONE:
        assert plan.rollback_status is not None
        return {"state": ExecutionState.FAILED.value, "rollback_status": plan.rollback_status.value}
    if plan.kind is UnwindKind.HALT_FAILED:
        return {
            "state": ExecutionState.COMPENSATION_STUCK.value,
            "rollback_status": RollbackStatus.STUCK.value,
            "rollback_reason": f"reversal of step {name!r} failed: {reason}",
        }
    # COMPENSATE publishes the next reversal; HALT_VANISHED is parked by plan_unwind.
    return {}


_STEP_OUTCOME = {
    "compensation_status": prepared.param("outcome", step_records.c.compensation_status),
    "compensation_reason": prepared.param("reason", step_records.c.compensation_reason),
    "compensated_at": prepared.param("at", step_records.c.compensated_at),
    "compensation_lease_expires_at": None,
}


@functools.cache
def _outcome_in_one(changes: tuple[str, ...]) -> Any:
    """PostgreSQL: lock the compensating run, settle the step held by this attempt, and
    move the run, in one statement whose rowcount is 1 only if all three happened."""
    run = prepared.bumped_run(changes)
    return prepared.run_and_step_in_one(
        prepared.compensating_run(), held_params(REVERSE), run, _STEP_OUTCOME, reversal=True
    )


@functools.cache
def _run_moved(changes: tuple[str, ...]) -> Any:
    return (
        update(executions).where(prepared.compensating_run()).values(**prepared.bumped_run(changes))
    )


@functools.cache
def _step_outcome() -> Any:
    return update(step_records).where(held_params(REVERSE)).values(**_STEP_OUTCOME)


def _outcome_in_a_transaction(
    connection: Connection, changes: tuple[str, ...], params: dict[str, Any]
) -> None:
    """Elsewhere: the same two row changes in one transaction, run row (its lock) first;
    statements built once per shape (SQLite sends them to its driver directly)."""
    if drivers.rowcount(connection, _run_moved(changes), params) != 1:
        raise Conflict(params["run_id"])
    if drivers.rowcount(connection, _step_outcome(), params) != 1:
        raise Conflict(params["run_id"])  # rolls the run's change back


#: A reversal outcome -> the kind of its attempt's history row.
ENDED = {
    CompensationOutcome.COMPENSATED.value: Kind.REVERSAL_COMPLETED,
    CompensationOutcome.FAILED.value: Kind.REVERSAL_FAILED,
    CompensationOutcome.SKIPPED.value: Kind.REVERSAL_SKIPPED,
}


def record_compensation(
    db: Database,
    reversal: Attempt,
    *,
    outcome: CompensationOutcome,
    reason: str | None,
    compensations: Collection[str],
    now: datetime,
    steps: Sequence[StepRecord],
    committed: bool,
    holds_slot: bool = False,
) -> UnwindStep | None:
    """Record a reversal's definitive outcome together with the unwind's next move.

    ``steps``/``committed``: the run as this attempt's claim found it. A failure parks the
    run (HALT_FAILED); a success returns the next step to reverse, or DONE once the run was
    closed. None: the claim was lost to another worker (nothing was written).
    ``holds_slot``: the run's saga has a flow-control limit (a run it closes gives its
    slot back in the same transaction).
    """
    name = reversal.name
    plan = next_after_outcome(steps, committed, compensations, name, outcome, reason)
    changes = _run_changes(plan, name, reason)
    stamp = to_db_time(now)
    params: dict[str, Any] = {
        "run_id": reversal.execution_id,
        "step_name": name,
        "attempt": reversal.attempt,
        "reversal_holder": reversal.holder,
        "outcome": outcome.value,
        "reason": reason,
        "at": stamp,
        "attempt_kind": ENDED[outcome.value].value,
        "attempt_started": attempts.started(reversal.claimed_at),
        "run_updated_at": stamp,
        **prefixed("set_", changes),
    }
    shape = tuple(sorted(changes))
    parks = plan.kind is UnwindKind.HALT_FAILED
    releases = holds_slot and plan.kind is UnwindKind.DONE
    if db.dialect == "postgresql" and not parks and not releases:
        with db.single_statement() as connection:
            written = drivers.rowcount(connection, _outcome_in_one(shape), params) == 1
        return plan if written else None
    try:
        # A park (never the happy path) takes a transaction: its history row goes with it.
        with db.transaction() as connection:
            if db.dialect == "postgresql":
                if connection.execute(_outcome_in_one(shape), params).rowcount != 1:
                    raise Conflict(reversal.execution_id)
            else:
                _outcome_in_a_transaction(connection, shape, params)
                ended = ENDED[outcome.value]
                attempts.write_row(connection, reversal, ended, now, reason, reversal=True)
            if parks:
                reason = changes["rollback_reason"]
                history.write_parked(
                    connection, reversal.execution_id, name, reversal.attempt, reason, now
                )
            if releases:
                flow.release(connection, reversal.execution_id, now)
    except Conflict:
        return None
    return plan
