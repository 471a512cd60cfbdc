"""Every step attempt leaves one history row when it ends, written with its outcome: its
start and end, how it ended, and the worker process and task that ran it (issue 28)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner

from celery_saga import ExecutionState
from celery_saga.cli import saga
from celery_saga.decisions.cursor import Advance
from celery_saga.records import Attempt
from celery_saga.runtime.holders import parse_holder
from celery_saga.store import claims, forward, history, joins, queries, step_failure, unwind
from celery_saga.store.database import Database
from celery_saga.store.history import ATTEMPT_KINDS, REVERSAL_KINDS, HistoryEntry
from tests.conftest import Harness
from tests.test_store_conditions import NOW, _claimed_run, db  # noqa: F401 (fixture)

LATER = NOW + timedelta(seconds=120)  # past the first claim's 60 s lease


def _attempt_rows(database: Database, execution_id: str) -> list[HistoryEntry]:
    return [e for e in history.load(database, execution_id) if e.kind in ATTEMPT_KINDS]


def _held(execution_id: str, attempt: int = 1) -> Attempt:
    return Attempt(execution_id, "a", 0, 0, attempt, NOW)


def _claim_again(database: Database, execution_id: str, at: Any) -> int | None:
    record = queries.load_step(database, execution_id, "a")
    assert record is not None
    return forward.claim_step(
        database,
        execution_id=execution_id,
        name="a",
        node=0,
        sub=0,
        definition_hash="h",
        idempotency_key="k",
        compensatable=True,
        lease_expires_at=at + timedelta(seconds=60),
        now=at,
        existing=record,
        holder="node-b/7/task-2",
    )


def test_a_completed_attempt_writes_its_row_with_the_outcome(db: Database) -> None:  # noqa: F811
    execution_id = _claimed_run(db)
    end = NOW + timedelta(seconds=2)
    advance = Advance(1, 0, False, False)
    step = _held(execution_id)
    assert forward.record_step_completed(db, step, result_blob=b"\xc0", advance=advance, now=end)
    (row,) = _attempt_rows(db, execution_id)
    assert (row.kind, row.step, row.attempt) == ("step-completed", "a", 1)
    assert (row.started_at, row.at, row.detail) == (NOW, end, None)
    # refused (the claim is no longer this attempt's): no row either
    assert not forward.record_step_completed(
        db, step, result_blob=b"\xc0", advance=advance, now=end
    )
    assert len(_attempt_rows(db, execution_id)) == 1


def test_a_retry_then_a_lapsed_attempt_then_a_final_failure(db: Database) -> None:  # noqa: F811
    execution_id = _claimed_run(db)
    assert claims.release(db, _held(execution_id), reason="boom 1", now=NOW)
    assert _claim_again(db, execution_id, NOW) == 2  # a retry's claim: nothing was lost
    assert _claim_again(db, execution_id, LATER) == 3  # attempt 2's lease lapsed
    failed = step_failure.record_step_failed(
        db,
        Attempt(execution_id, "a", 0, 0, 3, LATER),
        members=["a"],
        advance=Advance(0, 0, False, False),
        compensations={"a"},
        now=LATER + timedelta(seconds=1),
        error="boom 3",
    )
    assert failed is not None and failed.settled
    rows = _attempt_rows(db, execution_id)
    assert [(r.kind, r.attempt) for r in rows] == [
        ("step-retrying", 1),
        ("step-lost", 2),
        ("step-failed", 3),
    ]
    retrying, lost, final = rows
    assert retrying.detail == "boom 1" and retrying.started_at == NOW
    assert lost.holder == "node-b/7/task-2" and "lease lapsed" in (lost.detail or "")
    assert final.holder == "node-b/7/task-2" and final.detail == "boom 3"
    assert final.started_at == LATER


def test_a_released_claim_is_not_counted_lost_when_taken_again(db: Database) -> None:  # noqa: F811
    execution_id = _claimed_run(db)
    step = _held(execution_id)
    assert claims.give_up(db, step, now=NOW, why="its worker is shutting down")
    assert not claims.give_up(db, _held(execution_id, 2), now=NOW, why="not held")
    assert _claim_again(db, execution_id, NOW + timedelta(seconds=1)) == 2
    rows = _attempt_rows(db, execution_id)
    assert [(r.kind, r.attempt, r.detail) for r in rows] == [
        ("step-released", 1, "its worker is shutting down")
    ]


def test_a_group_member_and_a_failure_in_a_transaction_write_their_rows(
    db: Database,  # noqa: F811
) -> None:
    execution_id = _claimed_run(db)
    settled = joins.record_step_settled(
        db,
        _held(execution_id),
        members=["a"],
        compensations={"a"},
        now=NOW,
        advance=Advance(0, 0, False, False),
        error="declined",
    )
    assert settled is not None and settled.settled
    (row,) = _attempt_rows(db, execution_id)
    assert (row.kind, row.attempt, row.detail) == ("step-failed", 1, "declined")


def _show(harness: Harness, execution_id: str, *more: str) -> str:
    obj = SimpleNamespace(app=harness.test_app.app)
    result = CliRunner().invoke(saga, ["show", execution_id, *more], obj=obj)
    assert result.exit_code == 0, result.output
    return result.output


def test_each_attempt_on_a_real_worker_names_its_worker_and_task(harness: Harness) -> None:
    run = harness.start("five", {"order": 300, "plan": {"s3": {"fail_attempts": 1}}})
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    rows = _attempt_rows(harness.engine.db, run.id)
    assert [(r.kind, r.step, r.attempt) for r in rows] == [
        ("step-completed", "s1", 1),
        ("step-completed", "s2", 1),
        ("step-retrying", "s3", 1),
        ("step-completed", "s3", 2),
        ("step-completed", "s4", 1),
        ("step-completed", "s5", 1),
    ]
    tasks = set()
    for row in rows:
        assert row.started_at is not None and row.started_at <= row.at
        assert row.holder is not None
        parsed = parse_holder(row.holder)
        assert parsed is not None, row.holder
        node, pid, task_id = parsed
        assert node and pid > 0 and len(task_id) >= 32, row.holder
        tasks.add(task_id)
    assert len(tasks) == len(rows), "each attempt is its own task"
    assert "s3 refused order 300" in (rows[2].detail or ""), rows[2]

    shown = json.loads(_show(harness, run.id, "--json"))
    kinds = [h["kind"] for h in shown["history"]]
    assert kinds.count("step-completed") == 5 and "step-retrying" in kinds
    (retried,) = [e for e in shown["timeline"] if e["kind"] == "step-retrying"]
    assert retried["step"] == "s3" and retried["took"].startswith("took ")
    text = _show(harness, run.id)
    assert f"s3 attempt 1 on {rows[2].holder}" in text, text
    assert f"on {rows[3].holder}" in text, text


def test_a_final_failure_on_a_real_worker_writes_step_failed(harness: Harness) -> None:
    run = harness.start("five", {"order": 301, "plan": {"s4": {"fail": True}}})
    assert run.wait(30).state is ExecutionState.FAILED, harness.worker_logs()
    rows = _attempt_rows(harness.engine.db, run.id)
    assert [(r.kind, r.step) for r in rows][-1] == ("step-failed", "s4")
    assert rows[-1].detail == run.get().record.failure_reason


def _reversal_rows(database: Database, execution_id: str) -> list[HistoryEntry]:
    return [e for e in history.load(database, execution_id) if e.kind in REVERSAL_KINDS]


def test_each_reversal_attempt_on_a_real_worker_leaves_its_row(harness: Harness) -> None:
    run = harness.start("five", {"order": 302, "plan": {"s4": {"fail": True}}})
    assert run.wait(30).state is ExecutionState.FAILED, harness.worker_logs()
    rows = _reversal_rows(harness.engine.db, run.id)
    assert [(r.kind, r.step, r.attempt) for r in rows] == [
        ("reversal-completed", "s3", 1),
        ("reversal-completed", "s2", 1),
        ("reversal-completed", "s1", 1),
    ]
    tasks = set()
    for row in rows:
        assert row.started_at is not None and row.started_at <= row.at, row
        parsed = parse_holder(row.holder or "")
        assert parsed is not None, row.holder
        tasks.add(parsed[2])
    assert len(tasks) == 3, "each reversal attempt is its own task"


def test_a_reversal_that_keeps_failing_records_each_attempt_then_parks(harness: Harness) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)  # s2's reversal keeps failing
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": 303, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    rows = [
        (e.kind, e.step, e.attempt)
        for e in history.load(harness.engine.db, run.id)
        if e.kind in REVERSAL_KINDS or e.kind == "parked"
    ]
    assert rows == [
        ("reversal-completed", "s3", 1),
        ("reversal-retrying", "s2", 1),
        ("reversal-retrying", "s2", 2),
        ("reversal-failed", "s2", 3),
        ("parked", "s2", 3),
    ]
    failed = _reversal_rows(harness.engine.db, run.id)[1:]
    assert all("cannot undo s2" in (r.detail or "") for r in failed), failed
    text = _show(harness, run.id)
    assert "s2 reversal attempt 1 on " in text and "s2 reversal attempt 2 on " in text, text


def _compensating_run(database: Database) -> str:
    """A run whose step ``a`` completed and which is now unwinding (``a`` owed a reversal)."""
    execution_id = _claimed_run(database)
    advance = Advance(1, 0, False, False)
    step = _held(execution_id)
    assert forward.record_step_completed(
        database, step, result_blob=b"\xc0", advance=advance, now=NOW
    )
    failed = forward.fail_execution(
        database, execution_id=execution_id, reason="later", compensations={"a"}, now=NOW
    )
    assert failed is not None
    return execution_id


def _claim_reversal(database: Database, execution_id: str, attempt: int, at: Any) -> bool:
    record = queries.load_step(database, execution_id, "a")
    assert record is not None
    return unwind.claim_compensation(
        database,
        Attempt.reversal(execution_id, "a", attempt, at),
        lease_expires_at=at + timedelta(seconds=60),
        now=at,
        holder=f"node-r/{attempt}/task-{attempt}",
        previous=record,
    )


def test_a_released_then_a_lapsed_reversal_attempt(db: Database) -> None:  # noqa: F811
    execution_id = _compensating_run(db)
    assert _claim_reversal(db, execution_id, 1, NOW)
    released = Attempt.reversal(execution_id, "a", 1, NOW)
    assert claims.give_up(db, released, now=NOW, why="its worker is shutting down")
    assert _claim_reversal(db, execution_id, 2, NOW + timedelta(seconds=1))
    assert _claim_reversal(db, execution_id, 3, LATER)  # attempt 2's lease lapsed
    assert claims.release(
        db, Attempt.reversal(execution_id, "a", 3, LATER), reason="boom", now=LATER
    )
    rows = _reversal_rows(db, execution_id)
    assert [(r.kind, r.attempt, r.holder) for r in rows] == [
        ("reversal-released", 1, "node-r/1/task-1"),
        ("reversal-lost", 2, "node-r/2/task-2"),
        ("reversal-retrying", 3, "node-r/3/task-3"),
    ]
    assert rows[2].detail == "boom" and rows[2].started_at == LATER
