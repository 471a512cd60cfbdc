"""A step's final failure in one write on PostgreSQL: settle it, fail the run, and carry
the unwind's first move, as one statement with one WAL flush (a success is one too).

The move is decided before the write, from one read of the run and its steps
(``next_unwind_step``). That read cannot go stale where it matters: while the run stands
at this step and this attempt holds the step, no other record of the run changes (nothing
else runs at a sequential position, nothing is reversed before the run is compensating),
and the write lands only under exactly those conditions; otherwise it changes nothing and
the claim counts as lost, as the transaction it replaces would have found.

This rests on two invariants that any new writer must keep: a run never becomes
``running`` again at a position it was at (the cursor only moves forward, and nothing turns
a compensating, failed or parked run back into a running one), and nothing changes a step
record's ``compensatable`` or ``compensation_status`` while its run is running.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime

from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import UnwindKind, next_unwind_step
from celery_saga.records import Attempt, ExecutionState, StepStatus
from celery_saga.store import drivers, flow, forward, joins, prepared, queries
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import GroupResult


def record_step_failed(
    db: Database,
    step: Attempt,
    *,
    members: Sequence[str],
    advance: Advance,
    compensations: Collection[str],
    now: datetime,
    error: str,
) -> GroupResult | None:
    """Record a step's final failure: in one statement where the store has it and the step
    settles its position alone, else as a member of its group
    (``joins.record_step_settled``)."""
    if len(members) == 1 and db.dialect == "postgresql":
        return fail_held_step(db, step, compensations=compensations, now=now, error=error)
    return joins.record_step_settled(
        db,
        step,
        members=members,
        compensations=compensations,
        now=now,
        advance=advance,
        error=error,
    )


def fail_held_step(
    db: Database,
    step: Attempt,
    *,
    compensations: Collection[str],
    now: datetime,
    error: str,
) -> GroupResult | None:
    """Record that ``step``, alone at its position, failed for good, and fail the run with
    the unwind's first move. PostgreSQL only. None: the run is no longer at this step
    under this attempt (nothing was written)."""
    execution, steps = queries.load_snapshot(db, step.execution_id)
    position = (step.node, step.sub)
    here = execution is not None and (execution.cursor, execution.cursor_sub) == position
    if execution is None or not here or execution.state is not ExecutionState.RUNNING:
        return None
    held = next((s for s in steps if s.name == step.name), None)
    if held is None or (held.status, held.attempts) != (StepStatus.RUNNING, step.attempt):
        return None  # taken over: the write would be refused
    settled = [
        replace(s, status=StepStatus.FAILED, error=error) if s.name == step.name else s
        for s in steps
    ]
    plan = next_unwind_step(settled, execution.committed_at is not None, compensations)
    changes = forward.failed_run_values(plan, error)
    stamp = to_db_time(now)
    params = {
        **forward.held_step_params(step, stamp),
        "step_error": error,
        **forward.prefixed("set_", changes),
    }
    statement = prepared.fail_in_one(tuple(sorted(changes)))
    if execution.flow_key is not None and plan.kind is UnwindKind.DONE:
        with db.transaction() as connection:  # the run ends: its slot goes with it
            if drivers.rowcount(connection, statement, params) != 1:
                return None
            flow.release(connection, step.execution_id, now)
        return GroupResult(settled=True, failure_reason=error, unwind=plan)
    with db.single_statement() as connection:
        if drivers.rowcount(connection, statement, params) != 1:
            return None
    return GroupResult(settled=True, failure_reason=error, unwind=plan)
