"""The hot path's statements, built once with bind parameters.

Building a Core statement per call (and hashing it for SQLAlchemy's compiled cache) cost
more CPU than the database spent running it; these are built on first use per shape and
reused with fresh parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    insert,
    literal,
    literal_column,
    null,
    select,
    update,
)

from celery_saga.records import ExecutionState, StepStatus
from celery_saga.store.directions import FORWARD, held_params
from celery_saga.store.history import Kind
from celery_saga.store.tables import executions, history, pauses, step_records

FIRST_CLAIM_COLUMNS = (
    "execution_id",
    "name",
    "node",
    "sub",
    "status",
    "attempts",
    "idempotency_key",
    "compensatable",
    "lease_expires_at",
    "started_at",
    "compensation_attempts",
    "child_execution_id",
    "holder",
    "trace_context",
)

#: The columns a new run is stored with (the rest take their defaults).
NEW_RUN_COLUMNS = (
    *("id", "saga_name", "definition_hash", "state", "cursor", "cursor_sub", "input"),
    *("committed_at", "parent_execution_id", "created_at", "updated_at", "version"),
    *("deadline_at", "members_settled", "members_failed", "flow_key", "trace_context"),
)


def param(name: str, column: Any) -> Any:
    """A bind parameter ``name`` typed as ``column``, for statements built once."""
    return bindparam(name, type_=column.type)


def run_at_cursor() -> Any:
    """Params ``run_id``, ``run_node``, ``run_sub``: the run is live at that position."""
    return (
        (executions.c.id == param("run_id", executions.c.id))
        & (executions.c.state == ExecutionState.RUNNING.value)
        & (executions.c.cursor == param("run_node", executions.c.cursor))
        & (executions.c.cursor_sub == param("run_sub", executions.c.cursor_sub))
    )


def compensating_run() -> Any:
    """Param ``run_id``: the run is compensating."""
    return (executions.c.id == param("run_id", executions.c.id)) & (
        executions.c.state == ExecutionState.COMPENSATING.value
    )


def run_on_graph() -> Any:
    """Param ``run_hash``: the run was started on the deployed definition."""
    return executions.c.definition_hash == param("run_hash", executions.c.definition_hash)


def run_live_here_locked(paused_check: bool = False) -> Any:
    """EXISTS over the run row at this position, taking a share lock on it (see first_claim);
    ``paused_check``: and its step not paused (``not_paused``)."""
    here = select(executions.c.id).where(run_at_cursor(), run_on_graph())
    if paused_check:
        here = here.where(not_paused())
    return here.with_for_update(read=True).exists()


def not_paused() -> Any:
    """Param ``pause_step``: no pause of the run's saga as a whole ('') or of that step
    (``tables.pauses``), read in the claim's own statement: a claim that begins after a
    pause is stored is refused (tests/test_pause.py), at no statement of its own."""
    match = (pauses.c.saga_name == executions.c.saga_name) & pauses.c.step_name.in_(
        [literal(""), param("pause_step", pauses.c.step_name)]
    )
    return ~select(pauses.c.step_name).where(match).exists()


def commit_without_flush_wait() -> Any:
    """A condition that is always true and makes the statement's own (autocommit)
    transaction commit without waiting for its WAL flush (PostgreSQL): for claims, which
    other workers see at once either way; only a database server crash can lose one.
    No extra round trip: the setting is local to the statement's transaction."""
    # Literals, not binds: the statement text shows (and pg_stat_statements keys on) it.
    flag: Any = literal_column("set_config('synchronous_commit', 'off', true)")
    return select(flag).scalar_subquery().is_not(None)


def step_held() -> Any:
    """Params ``step_run``, ``step_name``, ``step_attempt``, ``step_holder``: still running
    under our claim (``directions.held_params``)."""
    return held_params(FORWARD)


@functools.cache
def first_claim(returning: bool, durable: bool = True, paused_check: bool = False) -> Any:
    """INSERT the START record only while the run is live here on the deployed graph (and,
    ``paused_check``, its step not paused: param ``pause_step``).

    Params: ``new_<column>`` for each of FIRST_CLAIM_COLUMNS, the ``run_at_cursor`` ones and
    ``run_hash``.
    """
    # One row per run row that is live here; FOR SHARE makes a claim racing a transaction
    # that is failing the run wait for it and then see the new state (PostgreSQL otherwise
    # reads the old row version and inserts a START record the failure never planned for).
    values = (
        select(*(param(f"new_{c}", step_records.c[c]).label(c) for c in FIRST_CLAIM_COLUMNS))
        .select_from(executions)
        .where(run_at_cursor(), run_on_graph())
        .with_for_update(read=True)
    )
    if paused_check:
        values = values.where(not_paused())
    if not durable:
        values = values.where(commit_without_flush_wait())
    statement = insert(step_records).from_select(list(FIRST_CLAIM_COLUMNS), values)
    return statement.returning(step_records.c.id) if returning else statement


def _completion_values(finished: bool, pivot: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    run: dict[str, Any] = {
        "version": executions.c.version + 1,
        "updated_at": param("run_updated_at", executions.c.updated_at),
    }
    if finished:
        run["state"] = ExecutionState.COMPLETED.value
        run["deadline_at"] = None  # the deadline index holds live runs only
    else:
        run["cursor"] = param("run_next_node", executions.c.cursor)
        run["cursor_sub"] = param("run_next_sub", executions.c.cursor_sub)
    if pivot:
        run["committed_at"] = param("run_committed_at", executions.c.committed_at)
    step = {
        "status": StepStatus.COMPLETED.value,
        "result": param("step_result", step_records.c.result),
        "completed_at": param("step_completed_at", step_records.c.completed_at),
        "lease_expires_at": None,
    }
    return run, step


def run_and_step_in_one(
    run_guard: Any,
    step_guard: Any,
    run: dict[str, Any],
    step: dict[str, Any],
    ended: Kind | None = None,
    reversal: bool = False,
) -> Any:
    """PostgreSQL: change the run matching ``run_guard`` and the step matching
    ``step_guard`` in ONE statement, whose rowcount is 1 only if both changed, and add the
    attempt's history row (``ended``: its kind; None: no row) when they do. The run is
    locked first: the step row may only change together with it (a CTE's UPDATE commits
    even when the outer UPDATE then matches nothing). Params for the row:
    ``step_completed_at`` (the end), ``step_claimed_at`` (the start), and ``step_error``
    when ``step`` sets the error. ``reversal``: the row is the reversal attempt's instead,
    its kind the param ``attempt_kind``, its end ``at``, its start ``attempt_started`` and
    its detail ``reason``."""
    run_here = select(executions.c.id).where(run_guard).with_for_update().cte("run")
    settled = (
        update(step_records)
        .where(step_guard, step_records.c.execution_id.in_(select(run_here.c.id)))
        .values(**step)
        .returning(
            step_records.c.execution_id,
            step_records.c.name,
            step_records.c.attempts,
            step_records.c.holder,
            step_records.c.compensation_attempts,
            step_records.c.compensation_holder,
        )
        .cte("settled")
    )
    owner = executions.c.id == select(settled.c.execution_id).scalar_subquery()
    statement = update(executions).where(run_guard, owner).values(**run)
    if reversal:
        row = _reversal_row_from(settled.c)
    elif ended is not None:
        kind = literal(ended.value)
        detail = step.get("error", null())
        row = _attempt_row_from(settled.c, kind, "step_completed_at", "step_claimed_at", detail)
    else:
        return statement
    recorded = insert(history).from_select(list(ATTEMPT_ROW_COLUMNS), row).cte("recorded")
    return statement.add_cte(recorded)


#: The columns of a step attempt's history row, in ``_attempt_row_from``'s order.
ATTEMPT_ROW_COLUMNS = (
    *("execution_id", "at", "kind", "step", "attempt", "holder"),
    *("started_at", "detail"),
)


def _attempt_row_from(
    record: Any, kind: Any, end: str, start: str, detail: Any, reversal: bool = False
) -> Any:
    """SELECT the history row of the attempt holding ``record`` (the step record's columns:
    its number and holder, or its reversal's with ``reversal``), of ``kind``; ``end`` and
    ``start`` name the params of its times."""
    attempt = record.compensation_attempts if reversal else record.attempts
    holder = record.compensation_holder if reversal else record.holder
    return select(
        record.execution_id,
        param(end, history.c.at),
        kind,
        record.name,
        attempt,
        holder,
        param(start, history.c.started_at),
        detail,
    )


def _reversal_row_from(record: Any) -> Any:
    """The reversal attempt's row, as ``reversal.record_compensation`` passes its params."""
    kind = param("attempt_kind", history.c.kind)
    detail = param("reason", history.c.detail)
    return _attempt_row_from(record, kind, "at", "attempt_started", detail, reversal=True)


@functools.cache
def attempt_row(ended: Kind, reversal: bool = False) -> Any:
    """The history row of the attempt that holds a step record (its number and holder as
    the record says; its reversal's with ``reversal``), ending as ``ended``. Params:
    ``step_run``, ``step_name``, ``attempt_at`` (the end), ``attempt_started`` and
    ``attempt_detail``."""
    detail = param("attempt_detail", history.c.detail)
    kind = literal(ended.value)
    row = _attempt_row_from(
        step_records.c, kind, "attempt_at", "attempt_started", detail, reversal
    ).where(
        step_records.c.execution_id == param("step_run", step_records.c.execution_id),
        step_records.c.name == param("step_name", step_records.c.name),
    )
    return insert(history).from_select(list(ATTEMPT_ROW_COLUMNS), row)


@functools.cache
def fail_in_one(changes: tuple[str, ...]) -> Any:
    """PostgreSQL: record the held step FAILED and change the run (``set_<column>`` for
    each of ``changes``) in one statement. Params: the ``run_at_cursor`` and ``step_held``
    ones, ``run_updated_at``, ``step_error``, ``step_completed_at``."""
    step = {
        "status": StepStatus.FAILED.value,
        "error": param("step_error", step_records.c.error),
        "completed_at": param("step_completed_at", step_records.c.completed_at),
        "lease_expires_at": None,
    }
    return run_and_step_in_one(
        run_at_cursor(), step_held(), bumped_run(changes), step, Kind.STEP_FAILED
    )


@functools.cache
def member_in_one() -> Any:
    """PostgreSQL: settle a parallel member's success and count it on the run row in ONE
    statement, RETURNING the run's new count. Params: as ``complete_in_one``, and
    ``group_size``. Matches nothing (the caller then takes a transaction) for a run not
    counted yet, and for the member whose count would reach the group's size: the join
    is decided on the group's records, once a group, since the counts may be those a
    worker of an earlier release left when it joined the group before without resetting
    them."""
    _, step = _completion_values(False, False)
    size = param("group_size", executions.c.members_settled)
    run = {
        "version": executions.c.version + 1,
        "updated_at": param("run_updated_at", executions.c.updated_at),
        "members_settled": executions.c.members_settled + 1,
    }
    guard = run_at_cursor() & (executions.c.members_settled + 1 < size)
    statement = run_and_step_in_one(guard, step_held(), run, step, Kind.STEP_COMPLETED)
    return statement.returning(executions.c.members_settled)


@functools.cache
def complete_in_one(dialect: str, finished: bool, pivot: bool) -> tuple[Any, int] | None:
    """Settle the step and move the cursor in ONE statement, with the rowcount that means
    both rows changed; None where the dialect has no such statement (SQLite)."""
    run, step = _completion_values(finished, pivot)
    if dialect == "postgresql":
        statement = run_and_step_in_one(
            run_at_cursor(), step_held(), run, step, Kind.STEP_COMPLETED
        )
        return statement, 1
    if dialect in ("mysql", "mariadb"):
        joined = step_records.c.execution_id == executions.c.id
        both = {
            **{executions.c[k]: v for k, v in run.items()},
            **{step_records.c[k]: v for k, v in step.items()},
        }
        return update(executions).where(run_at_cursor(), joined, step_held()).values(both), 2
    return None


@functools.cache
def new_run() -> Any:
    """INSERT a run. Params: a value for each column of ``NEW_RUN_COLUMNS``."""
    return insert(executions).values({c: param(c, executions.c[c]) for c in NEW_RUN_COLUMNS})


@functools.cache
def new_run_started() -> Any:
    """PostgreSQL: INSERT a run and its ``started`` history row in ONE statement (a start
    costs no more round trips than before the history). Params: as ``new_run``."""
    run = new_run().returning(executions.c.id, executions.c.created_at).cte("new_run")
    started = select(run.c.id, run.c.created_at, literal(Kind.STARTED.value))
    return insert(history).from_select(["execution_id", "at", "kind"], started)


@functools.cache
def lock_run_at_cursor(changes: tuple[str, ...] = ()) -> Any:
    """Bump the run's version at this position (its row lock). Params: the
    ``run_at_cursor`` ones, ``run_updated_at`` and ``set_<column>`` for each of ``changes``."""
    return update(executions).where(run_at_cursor()).values(**bumped_run(changes))


def bumped_run(changes: tuple[str, ...]) -> dict[str, Any]:
    """A run row's new version, ``run_updated_at``, and ``set_<column>`` for each of
    ``changes``."""
    return {
        "version": executions.c.version + 1,
        "updated_at": param("run_updated_at", executions.c.updated_at),
        **_run_values(changes),
    }


def _run_values(changes: tuple[str, ...]) -> dict[str, Any]:
    return {
        key: ending_state(param(f"set_{key}", executions.c.state))
        if key == "state"
        else param(f"set_{key}", executions.c[key])
        for key in changes
    }


def ending_state(state: Any) -> Any:
    """``state``, except that a run whose cancel was stored ends ``cancelled``, not
    ``failed``, whichever of the unwind's writes ends it (guarantee 31)."""
    return case(
        (
            and_(state == ExecutionState.FAILED.value, executions.c.cancelled_at.is_not(None)),
            ExecutionState.CANCELLED.value,
        ),
        else_=state,
    )


@functools.cache
def update_run(changes: tuple[str, ...]) -> Any:
    """Set columns of a run (its row lock held). Params: ``run_id``, ``set_<column>``."""
    values = _run_values(changes)
    return (
        update(executions)
        .where(executions.c.id == param("run_id", executions.c.id))
        .values(**values)
    )


@functools.cache
def steps_of_run() -> Any:
    """Param ``run_id``: the run's step records, in start order."""
    run_id = param("run_id", step_records.c.execution_id)
    return (
        select(step_records)
        .where(step_records.c.execution_id == run_id)
        .order_by(step_records.c.id)
    )


@functools.cache
def run_by_id() -> Any:
    """Param ``run_id``: the run's row."""
    return select(executions).where(executions.c.id == param("run_id", executions.c.id))
