"""A step's final failure recorded in one write on PostgreSQL (store/step_failure.py): it
fails the run with the unwind's first move, and a refused write changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from celery_saga import Saga, SagaContext, SagaEngine
from celery_saga.decisions.unwind import UnwindKind
from celery_saga.records import Attempt, ExecutionState, RollbackStatus, StepStatus
from celery_saga.store import forward, queries, step_failure
from celery_saga.store.database import Database
from tests.conftest import in_process_pg_engine
from tests.test_store_conditions import NOW, _claimed_run, _complete_a
from tests.test_store_failures import _failing_first

LEASE = timedelta(seconds=60)


@pytest.fixture
def db(pg_db: Database) -> Database:
    return pg_db


def _run_at_second_step(db: Database, compensatable: bool = True) -> str:
    """Step ``a`` completed, step ``b`` claimed by attempt 1; both declare a compensation
    (``compensatable``) or neither does."""
    run = _claimed_run(db, compensatable)
    assert _complete_a(db, run)
    assert _claim_b(db, run, compensatable) == 1
    return run


def _claim_b(
    db: Database, run: str, compensatable: bool, existing: Any = None, now: Any = NOW
) -> int | None:
    return forward.claim_step(
        db,
        execution_id=run,
        name="b",
        node=1,
        sub=0,
        definition_hash="h",
        idempotency_key="k",
        compensatable=compensatable,
        lease_expires_at=now + LEASE,
        now=now,
        existing=existing,
    )


def _fail_b(db: Database, run: str, attempt: int = 1) -> forward.GroupResult | None:
    return step_failure.fail_held_step(
        db,
        Attempt(run, "b", 1, 0, attempt),
        compensations={"a", "b"},
        now=NOW,
        error="ValueError: no stock",
    )


def test_the_failure_fails_the_run_with_the_unwind_s_first_move(db: Database) -> None:
    run = _run_at_second_step(db)
    result = _fail_b(db, run)
    assert result is not None and result.settled
    assert result.failure_reason == "ValueError: no stock"
    assert result.unwind is not None and result.unwind.kind is UnwindKind.COMPENSATE
    # The failed step is reversed first: its body may have done part of its work.
    assert result.unwind.record is not None and result.unwind.record.name == "b"
    execution, steps = queries.load_snapshot(db, run)
    assert execution is not None and execution.state is ExecutionState.COMPENSATING
    assert execution.failure_reason == "ValueError: no stock" and execution.version == 3
    failed = steps[1]
    assert (failed.status, failed.error, failed.lease_expires_at) == (
        StepStatus.FAILED,
        "ValueError: no stock",
        None,
    )


def test_with_nothing_to_reverse_the_run_ends_failed_at_once(db: Database) -> None:
    run = _run_at_second_step(db, compensatable=False)
    result = _fail_b(db, run)
    assert result is not None and result.unwind is not None
    assert result.unwind.kind is UnwindKind.DONE
    execution = queries.load_execution(db, run)
    assert execution is not None and execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE


def _read_before(monkeypatch: pytest.MonkeyPatch, db: Database, run: str) -> None:
    """The failure's read happens now, its write after what the test does next: the write's
    own conditions must refuse it."""
    snapshot = queries.load_snapshot(db, run)
    read = SimpleNamespace(load_snapshot=lambda *_: snapshot)
    monkeypatch.setattr(step_failure, "queries", read)


def test_a_claim_taken_over_records_nothing(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_at_second_step(db)
    _, steps = queries.load_snapshot(db, run)
    _read_before(monkeypatch, db, run)
    later = NOW + LEASE * 2  # attempt 1's lease has lapsed; attempt 2 holds the step now
    assert _claim_b(db, run, True, existing=steps[1], now=later) == 2
    assert _fail_b(db, run, attempt=1) is None
    monkeypatch.undo()
    execution, steps = queries.load_snapshot(db, run)
    assert execution is not None and execution.state is ExecutionState.RUNNING
    assert (steps[1].status, steps[1].attempts) == (StepStatus.RUNNING, 2)


def test_a_run_that_left_the_step_records_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_at_second_step(db)
    _read_before(monkeypatch, db, run)
    assert (
        forward.fail_execution(
            db, execution_id=run, reason="elsewhere", compensations={"a"}, now=NOW + LEASE * 2
        )
        is not None
    )
    assert _fail_b(db, run) is None
    monkeypatch.undo()
    execution, steps = queries.load_snapshot(db, run)
    assert execution is not None and execution.failure_reason == "elsewhere"
    assert steps[1].status is StepStatus.RUNNING, "the step row must not change alone"


# -- through the engine, with the store failing around the write ---------------------------
UNDONE: dict[str, list[str]] = {}


def _undo(name: str) -> Any:
    def compensate(ctx: SagaContext) -> None:
        UNDONE.setdefault(ctx.execution_id, []).append(name)

    return compensate


def _boom() -> None:
    raise ValueError("no stock")


@pytest.fixture
def engine() -> Iterator[SagaEngine]:
    """A PostgreSQL store and an in-process worker: the store functions can be patched."""
    saga = Saga("failing_here")
    saga.step("s0", lambda: None, compensate=_undo("s0"))
    saga.step("s1", lambda: None, compensate=_undo("s1"))
    saga.step("fails", _boom, retry=1)
    nothing_owed = Saga("nothing_owed")  # nothing to reverse: the failure ends the run
    nothing_owed.step("s0", lambda: None)
    nothing_owed.step("fails", _boom, retry=1)
    with in_process_pg_engine("fail", saga, nothing_owed, concurrency=2) as saga_engine:
        yield saga_engine


def _unwound(engine: SagaEngine, run_id: str) -> Any:
    deadline = time.monotonic() + 30
    while (execution := engine.handle(run_id).get()).state is not ExecutionState.FAILED:
        assert time.monotonic() < deadline, execution.state
        engine.fire_timers()  # beat's timer sweep sends what a lost reply left owed
        time.sleep(0.05)
    return execution


@pytest.mark.parametrize("lost_reply", [False, True], ids=["refused", "reply-lost"])
def test_the_failure_is_recorded_once_through_store_errors(
    engine: SagaEngine, monkeypatch: pytest.MonkeyPatch, lost_reply: bool
) -> None:
    flaky = _failing_first(step_failure.fail_held_step, failures=2, after=lost_reply)
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1].name)
        return flaky(*args, **kwargs)

    monkeypatch.setattr(step_failure, "fail_held_step", counted)
    run = engine.start("failing_here", {})
    execution = _unwound(engine, run.id)
    assert execution.failure_reason == "ValueError: no stock"
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert UNDONE[run.id] == ["s1", "s0"], "each reversal once, in reverse order"
    assert execution.step("fails").attempts == 1
    # Refused twice, then written; or written with its reply lost, then found landed.
    assert calls == (["fails"] if lost_reply else ["fails"] * 3)


def test_a_run_ended_by_a_write_whose_reply_was_lost_is_announced(
    engine: SagaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = _failing_first(step_failure.fail_held_step, failures=1, after=True)
    monkeypatch.setattr(step_failure, "fail_held_step", lost)
    ended: list[dict[str, Any]] = []
    engine.on("saga-failed", lambda _event, fields: ended.append(fields))
    run = engine.start("nothing_owed", {})
    execution = _unwound(engine, run.id)
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE
    deadline = time.monotonic() + 5
    while not ended and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [f["execution_id"] for f in ended] == [run.id], "the end is announced once"
    assert ended[0]["rollback_status"] == "not_applicable"
