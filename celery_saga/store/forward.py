"""Forward-path writes. Each function is one transaction whose WHERE clause is the guarantee."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindKind, UnwindStep, next_unwind_step
from celery_saga.records import Attempt, ExecutionRecord, ExecutionState, StepRecord, StepStatus
from celery_saga.store import attempts, claims, drivers, flow, history, prepared
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.directions import FORWARD, claimed
from celery_saga.store.history import Kind
from celery_saga.store.queries import bump_and_load, load_steps
from celery_saga.store.tables import executions, step_records


def claim_step(
    db: Database,
    *,
    execution_id: str,
    name: str,
    node: int,
    sub: int,
    definition_hash: str,
    idempotency_key: str,
    compensatable: bool,
    lease_expires_at: datetime | None,
    now: datetime,
    existing: StepRecord | None,
    child_execution_id: str | None = None,
    holder: str | None = None,
    restored_at: datetime | None = None,
    pause_step: str | None = None,
    trace_context: str | None = None,
) -> int | None:
    """Claim the step for this worker; returns the attempt number, or None if not ours.

    The first start INSERTs the START record (with its forward key) only while the run is
    live at this position; the unique (execution, name) key turns a duplicate into a refusal.
    A retry or a re-claim after an expired lease is a compare-and-set on what we read. A
    sub-saga's record names its child and has no lease: no body runs in a worker for it.
    ``holder`` names the claiming process (``runtime/holders.py``). ``restored_at``: the
    holder writes back a claim the store lost (``decisions/lost_claims.py``), begun at
    ``now``; it waits for its flush, with its ``claim-restored`` history row.
    ``pause_step``: the step's name, to refuse the claim while it (or its saga) is paused.
    ``trace_context``: the traceparent of the attempt's span (``celery_saga.tracing``),
    kept for its reversal's link.
    """
    lease = None if lease_expires_at is None else to_db_time(lease_expires_at)
    at = {"run_id": execution_id, "run_node": node, "run_sub": sub, "run_hash": definition_hash}
    if pause_step is not None:
        at["pause_step"] = pause_step
    restored = None if restored_at is None else history.claim_restored(name, holder, restored_at)
    if existing is not None:
        claim = (lease, holder, trace_context)
        return _claim_again(db, existing, claim, at, now, restored)
    # The START record's columns, as the insert's bind parameters (``new_<column>``).
    params = {
        **at,
        "new_execution_id": execution_id,
        "new_name": name,
        "new_node": node,
        "new_sub": sub,
        "new_status": StepStatus.RUNNING.value,
        "new_attempts": 1,
        "new_idempotency_key": idempotency_key,
        "new_compensatable": compensatable,
        "new_lease_expires_at": lease,
        "new_started_at": to_db_time(now),
        "new_compensation_attempts": 0,
        "new_child_execution_id": child_execution_id,
        "new_holder": holder,
        "new_trace_context": trace_context,
    }
    durable = db.durable_claims or restored is not None
    with db.single_statement() if restored is None else db.transaction() as connection:
        try:
            if not _inserted_one(db, connection, params, durable, pause_step is not None):
                return None
        except IntegrityError:
            return None
        claims.taken_over(
            FORWARD, connection, execution_id, 1, lost=None, restored=restored, now=now
        )
        return 1


def _claim_again(
    db: Database,
    existing: StepRecord,
    claim: tuple[datetime | None, str | None, str | None],
    at: dict[str, Any],
    now: datetime,
    restored: history.HistoryEntry | None,
) -> int | None:
    """A retry's claim, or a takeover of a claim whose attempt never settled (its
    ``step-lost`` history row is written with it): a compare-and-set on ``existing``;
    ``claim``: its lease, holder and trace context."""
    lease, holder, trace_context = claim
    guard = (
        (step_records.c.execution_id == existing.execution_id)
        & (step_records.c.name == existing.name)
        & (step_records.c.status == existing.status.value)
        & (step_records.c.attempts == existing.attempts)
    )
    if existing.lease_expires_at is not None:
        guard &= step_records.c.lease_expires_at == to_db_time(existing.lease_expires_at)
    if not db.durable_claims and restored is None:
        guard &= prepared.commit_without_flush_wait()
    lost = existing.status is StepStatus.RUNNING and existing.lease_expires_at is not None
    with db.transaction() if lost or restored else db.single_statement() as connection:
        result = connection.execute(
            update(step_records)
            .where(guard, prepared.run_live_here_locked("pause_step" in at))
            .values({**claimed(FORWARD, lease, holder), **_traced(trace_context)}),
            at,
        )
        if result.rowcount != 1:
            return None
        number = existing.attempts + 1
        claims.taken_over(
            FORWARD,
            connection,
            existing.execution_id,
            number,
            lost=existing if lost else None,
            restored=restored,
            now=now,
        )
        return number


def _traced(trace_context: str | None) -> dict[str, str]:
    """A claim's trace context, set when it has one (a claim written back keeps its own)."""
    return {} if trace_context is None else {"trace_context": trace_context}


def _inserted_one(
    db: Database, connection: Connection, params: dict[str, Any], durable: bool, paused: bool
) -> bool:
    # PostgreSQL reports no rowcount for INSERT ... SELECT once SQLAlchemy adds its implicit
    # RETURNING; count the returned rows wherever SQLAlchemy runs it there (or on MySQL's
    # kin that return). SQLite's rowcount is exact and costs no result to fetch.
    returning = connection.dialect.insert_returning and db.dialect != "sqlite"
    if returning and not db.driver.direct(connection):
        statement = prepared.first_claim(returning=True, durable=durable, paused_check=paused)
        return len(connection.execute(statement, params).all()) == 1
    statement = prepared.first_claim(returning=False, durable=durable, paused_check=paused)
    return drivers.rowcount(connection, statement, params) == 1


def lock_execution(
    connection: Connection, execution_id: str, node: int, sub: int, now: datetime, **changes: Any
) -> None:
    """Bump the version of the run at this position (taking its row lock) or conflict."""
    params = {
        "run_id": execution_id,
        "run_node": node,
        "run_sub": sub,
        "run_updated_at": to_db_time(now),
        **prefixed("set_", changes),
    }
    statement = prepared.lock_run_at_cursor(tuple(sorted(changes)))
    if drivers.rowcount(connection, statement, params) != 1:
        raise Conflict(execution_id)


def release_if_ending(
    connection: Connection, advance: Advance, execution_id: str, now: datetime
) -> None:
    """A run whose end ``advance`` is, holding a flow-control slot, gives it back (or
    hands it on) in the transaction that ends it (guarantee 37)."""
    if advance.finished and advance.releases_slot:
        flow.release(connection, execution_id, now)


def advance_values(advance: Advance, now: datetime) -> dict[str, Any]:
    """The execution columns that move a run to ``advance``."""
    if advance.finished:
        values: dict[str, Any] = {"state": ExecutionState.COMPLETED.value}
    else:
        values = {"cursor": advance.node, "cursor_sub": advance.sub}
    if advance.passes_pivot:
        values["committed_at"] = to_db_time(now)
    return values


def record_step_completed(
    db: Database,
    step: Attempt,
    *,
    result_blob: bytes,
    advance: Advance,
    now: datetime,
) -> bool:
    """Outcome, cursor move and the attempt's history row in one transaction; False if
    someone else owns the step now.

    On PostgreSQL it is ONE statement (data-modifying CTEs); MySQL/MariaDB change both rows
    in one multi-table UPDATE and add the row after it; SQLite runs in-process and takes
    three.
    """
    stamp = to_db_time(now)
    combined = None
    if not advance.releases_slot:  # a run's end that gives a slot back takes a transaction
        combined = prepared.complete_in_one(db.dialect, advance.finished, advance.passes_pivot)
    try:
        if combined is None:
            with db.transaction() as connection:
                run = advance_values(advance, now)
                lock_execution(connection, step.execution_id, step.node, step.sub, now, **run)
                claims.settle(
                    connection,
                    step,
                    status=StepStatus.COMPLETED.value,
                    result=result_blob,
                    completed_at=stamp,
                )
                attempts.write_row(connection, step, Kind.STEP_COMPLETED, now)
                release_if_ending(connection, advance, step.execution_id, now)
            return True
        params = {
            **held_step_params(step, stamp),
            "run_next_node": advance.node,
            "run_next_sub": advance.sub,
            "run_committed_at": stamp,
            "step_result": result_blob,
        }
        statement, expected = combined
        if db.dialect == "postgresql":
            with db.single_statement() as connection:
                return drivers.rowcount(connection, statement, params) == expected
        with db.transaction() as connection:
            if connection.execute(statement, params).rowcount != expected:
                raise Conflict(step.execution_id)
            attempts.write_row(connection, step, Kind.STEP_COMPLETED, now)
            return True
    except Conflict:
        return False


@dataclass(frozen=True)
class GroupResult:
    """What settling one member of a node did: still waiting, advanced, or failed the run."""

    settled: bool
    failure_reason: str | None = None
    unwind: UnwindStep | None = None


def pass_position(
    db: Database, *, execution_id: str, node: int, sub: int, advance: Advance, now: datetime
) -> bool:
    """Move a run past a position where nothing ran (a loop whose condition ended it, an
    empty for_each): only while the run is live exactly there. Past its last node, with its
    ``run-completed`` history row."""
    try:
        with db.transaction() if advance.finished else db.single_statement() as connection:
            lock_execution(connection, execution_id, node, sub, now, **advance_values(advance, now))
            if advance.finished:
                why = "its last node ran nothing (a loop that ended, no item left)"
                history.note(connection, execution_id, Kind.RUN_COMPLETED, now, why)
                release_if_ending(connection, advance, execution_id, now)
    except Conflict:
        return False
    return True


def fail_run_locked(
    connection: Connection,
    execution_id: str,
    reason: str,
    committed: bool,
    compensations: Collection[str],
    now: datetime,
    steps: list[StepRecord] | None = None,
    *,
    holds_slot: bool = False,
) -> UnwindStep:
    """Fail a run whose row this transaction holds: compensating, or failed at once when
    nothing is owed a reversal. Returns the unwind's first move. ``steps``: the run's step
    records as this transaction already read them (read here otherwise). ``holds_slot``:
    the run has a flow-control key (it gives its slot back if it ends here)."""
    if steps is None:
        steps = load_steps(connection, execution_id)
    plan = next_unwind_step(steps, committed, compensations)
    values = {**failed_run_values(plan, reason), "updated_at": to_db_time(now)}
    statement = prepared.update_run(tuple(sorted(values)))
    drivers.rowcount(connection, statement, {"run_id": execution_id, **prefixed("set_", values)})
    if holds_slot and plan.kind is UnwindKind.DONE:
        flow.release(connection, execution_id, now)
    return plan


def fail_read_run(
    connection: Connection,
    run: ExecutionRecord,
    reason: str,
    compensations: Collection[str],
    now: datetime,
    steps: list[StepRecord] | None = None,
) -> UnwindStep:
    """``fail_run_locked`` of ``run`` as this transaction read it (its row lock held): its
    pivot, and whether it holds a flow-control slot, as read."""
    committed = run.committed_at is not None
    holds_slot = run.flow_key is not None
    return fail_run_locked(
        connection, run.id, reason, committed, compensations, now, steps, holds_slot=holds_slot
    )


def failed_run_values(plan: UnwindStep, reason: str) -> dict[str, Any]:
    """The run's columns once it failed for ``reason``: compensating, or failed at once
    when ``plan`` (the unwind's first move) says nothing is owed a reversal."""
    values: dict[str, Any] = {"failure_reason": reason, "wake_at": None, "deadline_at": None}
    if plan.kind is UnwindKind.DONE:
        assert plan.rollback_status is not None
        values.update(state=ExecutionState.FAILED.value, rollback_status=plan.rollback_status.value)
    else:
        values.update(state=ExecutionState.COMPENSATING.value)
    return values


def held_step_params(step: Attempt, stamp: datetime) -> dict[str, Any]:
    """The parameters of a one-statement outcome (``prepared.run_and_step_in_one``): the
    run at the step's position (``run_at_cursor``), the step this attempt holds
    (``step_held``), both stamped ``stamp`` (a store time)."""
    return {
        "run_id": step.execution_id,
        "run_node": step.node,
        "run_sub": step.sub,
        "run_updated_at": stamp,
        "step_run": step.execution_id,
        "step_name": step.name,
        "step_attempt": step.attempt,
        "step_holder": step.holder,
        "step_completed_at": stamp,
        "step_claimed_at": attempts.started(step.claimed_at),
    }


def prefixed(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as bind parameters named ``<prefix><column>``."""
    return {f"{prefix}{key}": value for key, value in values.items()}


def fail_execution(
    db: Database,
    *,
    execution_id: str,
    reason: str,
    compensations: Collection[str],
    now: datetime,
) -> UnwindStep | None:
    """Fail a live run for a reason outside any step (e.g. its definition changed), with its
    ``run-failed`` history row.

    Refused (None) while a step of the run is held by a live lease: its body may still be
    running, and reversing it now would race it. The pivot is read under the row lock, so a
    step that passed it a moment ago is honoured.
    """
    try:
        with db.transaction() as connection:
            running = executions.c.state == ExecutionState.RUNNING.value
            run = bump_and_load(connection, execution_id, running)
            if run is None:
                return None
            in_flight = connection.execute(
                select(step_records.c.id).where(
                    step_records.c.execution_id == execution_id,
                    step_records.c.status == StepStatus.RUNNING.value,
                    step_records.c.lease_expires_at > to_db_time(now),
                )
            ).first()
            if in_flight is not None:
                raise Conflict(execution_id)
            plan = fail_read_run(connection, run, reason, compensations, now)
            history.note(connection, execution_id, Kind.RUN_FAILED, now, reason)
            return plan
    except Conflict:
        return None
