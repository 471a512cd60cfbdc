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
from typing import Any

from celery_saga.decisions.cursor import Advance
from celery_saga.decisions.unwind import next_unwind_step
from celery_saga.records import ExecutionState, StepStatus
from celery_saga.store import forward, prepared, queries
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import GroupResult


def record_step_failed(
    db: Database,
    *,
    members: Sequence[str],
    advance: Advance,
    **fields: Any,
) -> GroupResult | None:
    """Record a step's final failure (``fields`` as ``fail_held_step`` takes them): in one
    statement where the store has it and the step settles its position alone, else as a
    member of its group (``forward.record_step_settled``)."""
    if len(members) == 1 and db.dialect == "postgresql":
        return fail_held_step(db, **fields)
    error = fields.pop("error")
    return forward.record_step_settled(db, members=members, advance=advance, error=error, **fields)


def fail_held_step(
    db: Database,
    *,
    execution_id: str,
    name: str,
    attempt: int,
    node: int,
    sub: int,
    compensations: Collection[str],
    now: datetime,
    error: str,
) -> GroupResult | None:
    """Record that attempt ``attempt`` of the step ``name``, alone at its position, failed
    for good, and fail the run with the unwind's first move. PostgreSQL only. None: the
    run is no longer at this step under this attempt (nothing was written)."""
    execution, steps = queries.load_snapshot(db, execution_id)
    here = execution is not None and (execution.cursor, execution.cursor_sub) == (node, sub)
    if execution is None or not here or execution.state is not ExecutionState.RUNNING:
        return None
    held = next((s for s in steps if s.name == name), None)
    if held is None or (held.status, held.attempts) != (StepStatus.RUNNING, attempt):
        return None  # taken over: the write would be refused
    settled = [
        replace(s, status=StepStatus.FAILED, error=error) if s.name == name else s for s in steps
    ]
    plan = next_unwind_step(settled, execution.committed_at is not None, compensations)
    changes = forward.failed_run_values(plan, error)
    stamp = to_db_time(now)
    params = {
        "run_id": execution_id,
        "run_node": node,
        "run_sub": sub,
        "run_updated_at": stamp,
        "step_run": execution_id,
        "step_name": name,
        "step_attempt": attempt,
        "step_error": error,
        "step_completed_at": stamp,
        **forward.prefixed("set_", changes),
    }
    statement = prepared.fail_in_one(tuple(sorted(changes)))
    with db.single_statement() as connection:
        if db.rowcount(connection, statement, params) != 1:
            return None
    return GroupResult(settled=True, failure_reason=error, unwind=plan)
