"""A parallel group's join, on counts kept on the run row (guarantee 32).

Each member settles its own record and counts itself on the run row (``members_settled``,
and ``members_failed`` for a failure) under the row's lock, on two rows whatever the
group's size: on PostgreSQL a success does it in one statement, elsewhere (and for a
failure) a transaction takes the lock first with the counting UPDATE. The member whose
count reaches the group's size takes a transaction and checks the group's records, once
a group: all settled, it joins (moves the run on, resetting the counts for the next
group, or fails it); otherwise the counts were not this group's (a worker of an earlier
release joined the group before without resetting them) and are set right from the
records. A run stored before the counts existed has NULL there: its next member counts
the group's records once and stores the counts.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from celery_saga.decisions.cursor import Advance, group_outcome
from celery_saga.records import Attempt, StepStatus
from celery_saga.store import attempts, claims, drivers, forward, history, prepared
from celery_saga.store.claims import Conflict
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.forward import GroupResult
from celery_saga.store.history import Kind
from celery_saga.store.queries import load_execution_row, load_steps
from celery_saga.store.tables import executions


def record_step_settled(
    db: Database,
    step: Attempt,
    *,
    members: Sequence[str],
    compensations: Collection[str],
    now: datetime,
    advance: Advance,
    result_blob: bytes | None = None,
    error: str | None = None,
) -> GroupResult | None:
    """Settle a member of a parallel group, or a step's final failure (a group of one);
    the member that settles last decides for the group. None means the claim was lost (or
    the run left this position): nothing changed."""
    changes: dict[str, Any] = {"completed_at": to_db_time(now)}
    if error is not None:
        changes.update(status=StepStatus.FAILED.value, error=error)
    else:
        changes.update(status=StepStatus.COMPLETED.value, result=result_blob)
    alone = len(members) == 1
    in_one = error is None and not alone and db.dialect == "postgresql"
    if in_one and _counted_in_one(db, step, len(members), now, result_blob):
        return GroupResult(settled=False)
    try:
        with db.transaction() as connection:
            if alone:
                forward.lock_execution(connection, step.execution_id, step.node, step.sub, now)
                counts: tuple[int, int] | None = (1, int(error is not None))
            else:
                counts = _count_member(connection, step, now, failed=error is not None)
            claims.settle(connection, step, **changes)
            ended = Kind.STEP_COMPLETED if error is None else Kind.STEP_FAILED
            attempts.write_row(connection, step, ended, now, error)
            if counts is None or (not alone and counts[0] >= len(members)):
                # no counts yet (a run stored before them), or they say the group is
                # complete: the records decide, so counts left by a release that did not
                # reset them when it joined the group before never join this one early
                counts = _count_records(connection, step, members)
            return _join(connection, step, members, counts, compensations, now, advance, error)
    except Conflict:
        return None


def join_if_settled(
    db: Database,
    step: Attempt,
    *,
    group: str,
    members: Sequence[str],
    compensations: Collection[str],
    now: datetime,
    advance: Advance,
) -> GroupResult | None:
    """Join a group whose members have all settled while the run still stands at it: its
    counts missed a member (settled by a worker of a release that kept none). Asked when a
    settled member's message comes again (the recovery sweep sends them to a run that
    stopped moving); counts the group's records under the run row's lock and stores the
    counts; a join writes its ``group-joined`` history row. None: the run is not at the
    group (nothing changed)."""
    try:
        with db.transaction() as connection:
            forward.lock_execution(connection, step.execution_id, step.node, step.sub, now)
            # still short, the counts stored now are right, and they do the join
            counts = _count_records(connection, step, members)
            result = _join(connection, step, members, counts, compensations, now, advance, None)
            if result.settled:
                detail = _joined_late(step.name, members, advance, result.failure_reason)
                history.note(
                    connection, step.execution_id, Kind.GROUP_JOINED, now, detail, step=group
                )
            return result
    except Conflict:
        return None


def _joined_late(member: str, members: Sequence[str], advance: Advance, failure: str | None) -> str:
    """What a late join's history row says: why it was late, and what it did to the run."""
    if failure is not None:
        move = f"the run failed: {failure}"
    else:
        move = "the run completed" if advance.finished else "the run moves on"
    return (
        f"every member ({', '.join(members)}) had settled but the group was not joined; "
        f"joined when the message of {member!r} came again: {move}"
    )


def _join(
    connection: Connection,
    step: Attempt,
    members: Sequence[str],
    counts: tuple[int, int],
    compensations: Collection[str],
    now: datetime,
    advance: Advance,
    error: str | None,
) -> GroupResult:
    """What the group's (settled, failed) ``counts`` decide: wait for more members, move
    the run on, or fail it."""
    settled, failures = counts
    if settled < len(members):
        return GroupResult(settled=False)
    if not failures:
        _move_on(connection, step, advance, now)
        return GroupResult(settled=True)
    return _fail_group(connection, step, members, compensations, now, error)


def _move_on(connection: Connection, step: Attempt, advance: Advance, now: datetime) -> None:
    values = {**forward.advance_values(advance, now), **_RESET}
    statement = prepared.update_run(tuple(sorted(values)))
    connection.execute(statement, {"run_id": step.execution_id, **forward.prefixed("set_", values)})
    forward.release_if_ending(connection, advance, step.execution_id, now)


_RESET = {"members_settled": 0, "members_failed": 0}


def _counted_in_one(
    db: Database, step: Attempt, size: int, now: datetime, result_blob: bytes | None
) -> bool:
    """PostgreSQL: a member's success settled and counted in one statement
    (``prepared.member_in_one``). False: nothing changed (the run is not counted yet, or
    this member is the group's last), and a transaction decides."""
    params = {
        **forward.held_step_params(step, to_db_time(now)),
        "step_result": result_blob,
        "group_size": size,
    }
    with db.single_statement() as connection:
        return bool(drivers.rows(connection, prepared.member_in_one(), params))


def _count_member(
    connection: Connection, step: Attempt, now: datetime, *, failed: bool
) -> tuple[int, int] | None:
    """Count this member on the run row while the run is live at its position (taking the
    row's lock) or conflict; the counts after it, None for a run not counted yet."""
    params = {
        "run_id": step.execution_id,
        "run_node": step.node,
        "run_sub": step.sub,
        "run_updated_at": to_db_time(now),
        "failed": int(failed),
    }
    returning = bool(connection.dialect.update_returning)
    result = connection.execute(_count_statement(returning), params)
    if returning:
        row = result.first()
        if row is None:
            raise Conflict(step.execution_id)
    else:
        if result.rowcount != 1:
            raise Conflict(step.execution_id)
        row = connection.execute(_counts_of_run(), params).first()
        assert row is not None
    settled, failures = row
    return None if settled is None or failures is None else (int(settled), int(failures))


@functools.cache
def _count_statement(returning: bool) -> Any:
    failed = bindparam("failed", type_=executions.c.members_failed.type)
    statement = (
        update(executions)
        .where(prepared.run_at_cursor())
        .values(
            **prepared.bumped_run(()),
            members_settled=executions.c.members_settled + 1,
            members_failed=executions.c.members_failed + failed,
        )
    )
    if returning:
        return statement.returning(executions.c.members_settled, executions.c.members_failed)
    return statement


@functools.cache
def _counts_of_run() -> Any:
    run_id = bindparam("run_id", type_=executions.c.id.type)
    return select(executions.c.members_settled, executions.c.members_failed).where(
        executions.c.id == run_id
    )


def _count_records(
    connection: Connection, step: Attempt, members: Sequence[str]
) -> tuple[int, int]:
    """The counts of a run stored before they were kept: read from the group's records
    (this member's included), and stored for the members that settle after it."""
    names = set(members)
    records = [s for s in load_steps(connection, step.execution_id) if s.name in names]
    done = (StepStatus.COMPLETED, StepStatus.FAILED)
    settled = sum(1 for s in records if s.status in done)
    failures = sum(1 for s in records if s.status is StepStatus.FAILED)
    values = {"members_settled": settled, "members_failed": failures}
    statement = prepared.update_run(tuple(sorted(values)))
    connection.execute(statement, {"run_id": step.execution_id, **forward.prefixed("set_", values)})
    return settled, failures


def _fail_group(
    connection: Connection,
    step: Attempt,
    members: Sequence[str],
    compensations: Collection[str],
    now: datetime,
    error: str | None,
) -> GroupResult:
    """The group settled with failures: fail the run, naming every failure (guarantee 19);
    a step alone is named by its own error."""
    steps = load_steps(connection, step.execution_id)
    reason = group_outcome(members, steps).reason if len(members) > 1 else (error or "")
    run = load_execution_row(connection, step.execution_id)
    committed = run is not None and run.committed_at is not None
    holds_slot = run is not None and run.flow_key is not None
    plan = forward.fail_run_locked(
        connection,
        step.execution_id,
        reason,
        committed,
        compensations,
        now,
        steps,
        holds_slot=holds_slot,
    )
    return GroupResult(settled=True, failure_reason=reason, unwind=plan)
