"""Guarantees whose breakage the rest of the suite did not notice (found by mutation testing).

Most races here are made deterministic: the test seeds the store with the state a racing
worker would leave behind, or shows the runtime the snapshot a message read just before
another worker wrote, and then checks that the store's conditional write is what refuses.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest
from celery import Celery
from sqlalchemy import insert, select

from celery_saga import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaEngine,
    StepRecord,
    StepStatus,
    path,
    step,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.cursor import advance
from celery_saga.records import Attempt
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.keys import idempotency_key
from celery_saga.runtime.ports import Settings
from celery_saga.store import forward, joins, queries, reversal, unwind
from celery_saga.store.codec import pack
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import decisions, step_records
from tests.conftest import Harness

Snapshot = tuple[ExecutionRecord | None, list[StepRecord]]


# -- helpers ------------------------------------------------------------------------------


def _seed(
    harness: Harness,
    saga: str,
    state: ExecutionState,
    cursor: int,
    steps: list[dict[str, Any]],
) -> str:
    """Store a run of ``saga`` as racing workers would have left it; no message is sent."""
    engine = harness.engine
    definition = engine.definition(saga)
    run_id = f"seed-{uuid.uuid4().hex[:16]}"
    now = get_clock().now()
    queries.create_execution(
        engine.db,
        execution_id=run_id,
        saga_name=saga,
        definition_hash=definition.hash,
        input_blob=pack({}),
        node=cursor,
        sub=0,
        state=state,
        committed=False,
        now=now,
    )
    with engine.db.transaction() as connection:
        for node, values in enumerate(steps):
            name = values["name"]
            spec = definition.find_step(name)
            assert spec is not None
            row = {
                "execution_id": run_id,
                "node": node,
                "sub": 0,
                "status": StepStatus.COMPLETED.value,
                "attempts": 1,
                "idempotency_key": idempotency_key(run_id, name, 0, "forward"),
                "compensatable": spec.compensatable,
                "started_at": to_db_time(now),
                "compensation_attempts": 0,
                **values,
            }
            connection.execute(insert(step_records).values(**row))
    return run_id


def _as_read_earlier(
    monkeypatch: pytest.MonkeyPatch,
    run_id: str,
    rewrite: Callable[[ExecutionRecord, list[StepRecord]], Snapshot],
) -> None:
    """Make the runtime see ``run_id`` as a message that read it a moment ago would."""
    real = queries.load_snapshot

    def stale(db: Any, execution_id: str) -> Snapshot:
        execution, steps = real(db, execution_id)
        if execution_id != run_id or execution is None:
            return execution, steps
        return rewrite(execution, steps)

    monkeypatch.setattr(queries, "load_snapshot", stale)


def _with_step(steps: list[StepRecord], name: str, **changes: Any) -> list[StepRecord]:
    return [replace(s, **changes) if s.name == name else s for s in steps]


def _ledger(harness: Harness, run_id: str, direction: str) -> list[str]:
    return [e.step for e in harness.test_app.entries(run_id) if e.direction == direction]


@pytest.fixture
def compensating_run(sqlite_harness: Harness) -> str:
    """A run of "five" whose unwind reversed s3 and has not reached s2 and s1 yet."""
    return _seed(
        sqlite_harness,
        "five",
        ExecutionState.COMPENSATING,
        3,
        [
            {"name": "s1"},
            {"name": "s2"},
            {
                "name": "s3",
                "compensation_status": CompensationOutcome.COMPENSATED.value,
                "compensation_attempts": 1,
                "compensated_at": to_db_time(get_clock().now()),
            },
            {"name": "s4", "status": StepStatus.FAILED.value, "error": "ValueError: no"},
        ],
    )


# -- guarantees 1 and 2: a reversal that carries an outcome is never run or written again ---


def test_late_duplicate_cannot_claim_a_reversal_that_already_has_its_outcome(
    sqlite_harness: Harness, compensating_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The duplicate read s3 after its claim lapsed and before its outcome was recorded; it
    # passes admission on that snapshot, so only the store's claim can stop it.
    run_id = compensating_run
    _as_read_earlier(
        monkeypatch,
        run_id,
        lambda execution, steps: (execution, _with_step(steps, "s3", compensation_status=None)),
    )
    sqlite_harness.engine.executor.unwinder.run(run_id, "s3", attempt=1)
    monkeypatch.undo()  # from here on, read what is really stored
    assert _ledger(sqlite_harness, run_id, "compensate") == []
    record = sqlite_harness.engine.get(run_id).step("s3")
    assert record.compensation_status is CompensationOutcome.COMPENSATED
    assert record.compensation_attempts == 1


def test_an_outcome_is_written_once_and_a_second_write_changes_nothing(
    sqlite_harness: Harness, compensating_run: str
) -> None:
    run_id = compensating_run
    before = sqlite_harness.engine.get(run_id)
    plan = reversal.record_compensation(
        sqlite_harness.engine.db,
        Attempt.reversal(run_id, "s3", 1),
        outcome=CompensationOutcome.FAILED,
        reason="ConnectionError: late report of the same attempt",
        compensations={"s1", "s2", "s3"},
        now=get_clock().now(),
        steps=before.steps,
        committed=False,
    )
    assert plan is None
    after = sqlite_harness.engine.get(run_id)
    assert after.step("s3") == before.step("s3")
    assert after.state is ExecutionState.COMPENSATING


# -- guarantee 3: resume gives the reversal a fresh set of attempts; abandon is final -------


def test_resume_gives_the_failed_reversal_its_full_set_of_attempts_again(
    harness: Harness,
) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": 30, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    harness.engine.resume_compensation(run.id)
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    failed = _ledger(harness, run.id, "compensate_failed")
    assert failed == ["s2"] * 6, "3 attempts before the halt, 3 more after the resume"


def test_an_abandoned_run_is_never_reopened_by_a_late_worker(harness: Harness) -> None:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": 31, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    harness.engine.abandon_compensation(run.id)
    abandoned = run.get()
    db, now = harness.engine.db, get_clock().now()
    # What a worker still holding an old message may try: park the run (its outcome could
    # not be recorded), re-plan the unwind, or claim a reversal.
    assert not unwind.park_unwind(db, execution_id=run.id, reason="late", now=now)
    assert unwind.plan_unwind(db, execution_id=run.id, compensations={"s1"}, now=now) is None
    assert not unwind.claim_compensation(
        db, Attempt.reversal(run.id, "s1", 1), lease_expires_at=now + timedelta(seconds=60), now=now
    )
    after = run.get()
    assert after.state is ExecutionState.FAILED
    assert after.rollback_status is RollbackStatus.STUCK
    assert after.record.version == abandoned.record.version
    assert after.steps == abandoned.steps


# -- guarantee 4: a leading pivot commits the run from the start -----------------------------


def test_saga_starting_with_a_pivot_never_compensates(sqlite_harness: Harness) -> None:
    app = sqlite_harness.test_app
    sqlite_harness.engine.register(
        Saga("committed_from_start")
        .pivot()
        .step("a", app.forward, compensate=app.reverse)
        .step("b", app.forward)
    )
    run = sqlite_harness.start("committed_from_start", {"plan": {"b": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE
    assert execution.record.committed_at is not None
    assert _ledger(sqlite_harness, run.id, "compensate") == []


def test_failure_past_the_pivot_never_enters_the_unwind(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = sqlite_harness.engine.executor.publisher
    published: list[tuple[str, str]] = []
    real = publisher.publish_compensation

    def spy(saga: str, spec: Any, execution_id: str, name: str, *args: Any) -> None:
        published.append((execution_id, name))
        real(saga, spec, execution_id, name, *args)

    monkeypatch.setattr(publisher, "publish_compensation", spy)
    run = sqlite_harness.start("pivoted", {"plan": {"b": {"fail": True}}})
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE
    assert [name for run_id, name in published if run_id == run.id] == []


# -- guarantee 7: reversal timeouts -----------------------------------------------------------


def test_an_engine_without_settings_still_has_a_finite_default_reversal_timeout(
    tmp_path: Path,
) -> None:
    assert Settings().compensation_timeout is not None
    app = Celery(f"defaults-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/defaults.sqlite3")
    timeout = engine.settings.compensation_timeout
    assert timeout is not None and math.isfinite(timeout) and timeout > 0
    assert engine.executor.unwinder.parts.settings.compensation_timeout == timeout


def test_a_declared_reversal_timeout_wins_over_the_engine_default(
    sqlite_harness: Harness,
) -> None:
    # The engine default is 4 s here; the step declares 0.5 s and its reversal takes 2.5 s.
    app = sqlite_harness.test_app
    sqlite_harness.engine.register(
        Saga("quick_undo")
        .step(
            "a",
            app.forward,
            compensate=app.reverse,
            compensation_retry=1,
            compensation_timeout=0.5,
        )
        .step("b", app.forward)
    )
    plan = {"a": {"undo_sleep": 2.5}, "b": {"fail": True}}
    execution = sqlite_harness.start("quick_undo", {"plan": plan}).wait(30)
    assert execution.state is ExecutionState.COMPENSATION_STUCK
    reason = execution.step("a").compensation_reason or ""
    assert reason == (
        "StepTimeoutError: reversal of step 'a' of saga 'quick_undo' timed out after 0.5s"
    )


def test_a_declared_step_timeout_fails_the_step(sqlite_harness: Harness) -> None:
    app = sqlite_harness.test_app
    sqlite_harness.engine.register(Saga("slow_step").step("a", app.forward, timeout=0.3))
    execution = sqlite_harness.start("slow_step", {"plan": {"a": {"sleep": 2}}}).wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.failure_reason == (
        "StepTimeoutError: step 'a' of saga 'slow_step' timed out after 0.3s"
    )


# -- guarantees 10 and 11: the store refuses claims and records a stale reader would make ---


def test_first_node_message_for_a_run_that_is_no_longer_live_never_runs_the_step(
    sqlite_harness: Harness,
) -> None:
    # The run failed before its first step started (say its definition changed and the
    # deploy was rolled back); the first node message arrives late, on the fast path.
    run_id = _seed(sqlite_harness, "five", ExecutionState.FAILED, 0, [])
    before = sqlite_harness.engine.get(run_id)
    sqlite_harness.engine.executor.run_node(NodeMessage(run_id, 0, 0, 0, 1), "five")
    after = sqlite_harness.engine.get(run_id)
    assert _ledger(sqlite_harness, run_id, "forward") == []
    assert after.steps == ()
    assert after.record.version == before.record.version


def test_retry_message_that_read_the_run_while_it_was_live_cannot_reclaim_the_step(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # s3 waits for its second attempt; another worker failed the run meanwhile. The retry
    # message read the run while it was still running.
    run_id = _seed(
        sqlite_harness,
        "five",
        ExecutionState.FAILED,
        2,
        [{"name": "s1"}, {"name": "s2"}, {"name": "s3", "status": StepStatus.PENDING.value}],
    )
    _as_read_earlier(
        monkeypatch,
        run_id,
        lambda execution, steps: (replace(execution, state=ExecutionState.RUNNING), steps),
    )
    sqlite_harness.engine.executor.run_node(NodeMessage(run_id, 2, 0, 0, 2), "five")
    monkeypatch.undo()  # from here on, read what is really stored
    assert _ledger(sqlite_harness, run_id, "forward") == []
    record = sqlite_harness.engine.get(run_id).step("s3")
    assert (record.status, record.attempts) == (StepStatus.PENDING, 1)


def test_a_duplicate_of_an_attempt_that_already_ran_cannot_run_it_again(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Attempt 2 of "t" ran and failed; attempt 3 is scheduled. A duplicate of the attempt-2
    # message read "t" while attempt 2 was still only scheduled.
    app = sqlite_harness.test_app
    sqlite_harness.engine.register(
        Saga("thrice").step("t", app.forward, compensate=app.reverse, retry=3, backoff=30)
    )
    run_id = _seed(
        sqlite_harness,
        "thrice",
        ExecutionState.RUNNING,
        0,
        [{"name": "t", "status": StepStatus.PENDING.value, "attempts": 2}],
    )
    _as_read_earlier(
        monkeypatch,
        run_id,
        lambda execution, steps: (execution, _with_step(steps, "t", attempts=1)),
    )
    sqlite_harness.engine.executor.run_node(NodeMessage(run_id, 0, 0, 0, 2), "thrice")
    monkeypatch.undo()  # from here on, read what is really stored
    assert _ledger(sqlite_harness, run_id, "forward") == []
    record = sqlite_harness.engine.get(run_id).step("t")
    assert (record.status, record.attempts) == (StepStatus.PENDING, 2)


def test_a_worker_whose_claim_was_taken_over_cannot_record_an_outcome(
    sqlite_harness: Harness,
) -> None:
    # s3's first holder outlived its lease and attempt 2 re-claimed it; the first holder
    # now finishes (or fails) and tries to record attempt 1.
    run_id = _seed(
        sqlite_harness,
        "five",
        ExecutionState.RUNNING,
        2,
        [
            {"name": "s1"},
            {"name": "s2"},
            {
                "name": "s3",
                "status": StepStatus.RUNNING.value,
                "attempts": 2,
                "lease_expires_at": to_db_time(get_clock().now() + timedelta(seconds=60)),
            },
        ],
    )
    engine, now = sqlite_harness.engine, get_clock().now()
    before = engine.get(run_id)
    nodes = engine.definition("five").nodes
    late = Attempt(run_id, "s3", 2, 0, 1)
    assert not forward.record_step_completed(
        engine.db,
        late,
        result_blob=pack({"step": "s3", "attempt": 1}),
        advance=advance(nodes, 2, 0),
        now=now,
    )
    settled = joins.record_step_settled(
        engine.db,
        late,
        members=["s3"],
        compensations={"s1", "s2", "s3", "s5"},
        now=now,
        advance=advance(nodes, 2, 0),
        error="ValueError: too late",
    )
    assert settled is None
    after = engine.get(run_id)
    assert after.record == before.record
    assert after.step("s3") == before.step("s3")


def test_a_node_message_redelivered_while_its_dead_holder_still_leases_it_resumes_later(
    sqlite_harness: Harness,
) -> None:
    # The worker running s1 died; its lease has a second left. The broker redelivers.
    lease = to_db_time(get_clock().now() + timedelta(seconds=1))
    run_id = _seed(
        sqlite_harness,
        "five",
        ExecutionState.RUNNING,
        0,
        [{"name": "s1", "status": StepStatus.RUNNING.value, "lease_expires_at": lease}],
    )
    sqlite_harness.engine.executor.run_node(
        NodeMessage(run_id, 0, 0, 0, 1), "five", redelivered=True
    )
    execution = sqlite_harness.engine.handle(run_id).wait(20)
    assert execution.state is ExecutionState.COMPLETED
    assert execution.step("s1").attempts == 2
    assert _ledger(sqlite_harness, run_id, "forward") == ["s1", "s2", "s3", "s4", "s5"]


def test_a_compensate_message_redelivered_while_its_dead_holder_still_leases_it_resumes_later(
    sqlite_harness: Harness,
) -> None:
    lease = to_db_time(get_clock().now() + timedelta(seconds=1))
    run_id = _seed(
        sqlite_harness,
        "five",
        ExecutionState.COMPENSATING,
        3,
        [
            {"name": "s1"},
            {"name": "s2"},
            {"name": "s3", "compensation_attempts": 1, "compensation_lease_expires_at": lease},
            {"name": "s4", "status": StepStatus.FAILED.value, "error": "ValueError: no"},
        ],
    )
    sqlite_harness.engine.executor.unwinder.run(run_id, "s3", attempt=1, redelivered=True)
    execution = sqlite_harness.engine.handle(run_id).wait(20)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert _ledger(sqlite_harness, run_id, "compensate") == ["s3", "s2", "s1"]


def test_a_step_gets_exactly_its_retry_attempts(harness: Harness) -> None:
    run = harness.start("five", {"order": 32, "plan": {"s3": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert _ledger(harness, run.id, "forward") == ["s1", "s2", "s3", "s3"]
    assert execution.step("s3").attempts == 2
    assert execution.failure_reason == "ValueError: s3 refused order 32"


class Order(pydantic.BaseModel):
    order_id: int


def test_a_value_that_would_be_refused_again_is_not_retried(sqlite_harness: Harness) -> None:
    calls: list[str] = []

    def unstorable() -> set[int]:
        calls.append("unstorable")
        return {1, 2}

    def charge() -> int:
        calls.append("charge")
        return 1

    sqlite_harness.engine.register(
        Saga("unstorable_retried").step("a", unstorable, retry=3, backoff=0.01),
        Saga("rejected_retried").step("a", charge, input_schema=Order, retry=3, backoff=0.01),
    )
    stored = sqlite_harness.start("unstorable_retried").wait(30)
    rejected = sqlite_harness.start("rejected_retried", {"order_id": "x"}).wait(30)
    assert (stored.state, rejected.state) == (ExecutionState.FAILED, ExecutionState.FAILED)
    assert (stored.failure_reason or "").startswith("PayloadError:")
    assert (rejected.failure_reason or "").startswith("SchemaValidationError:")
    assert stored.step("a").attempts == rejected.step("a").attempts == 1
    assert calls == ["unstorable"]


def test_a_retry_takes_the_checked_path_and_never_retries_the_first_claim(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cost, not safety: the fast path (INSERT of the START record) is for first attempts; a
    # retry would only find the record there and pay a failed INSERT before the real read.
    first_claims: list[tuple[str, str]] = []
    real = forward.claim_step

    def spy(db: Any, **kwargs: Any) -> int | None:
        if kwargs["existing"] is None:
            first_claims.append((kwargs["execution_id"], kwargs["name"]))
        return real(db, **kwargs)

    monkeypatch.setattr(forward, "claim_step", spy)
    run = sqlite_harness.start("five", {"plan": {"s3": {"fail_attempts": 1}}})
    assert run.wait(30).state is ExecutionState.COMPLETED
    mine = [name for run_id, name in first_claims if run_id == run.id]
    assert mine == ["s1", "s2", "s3", "s4", "s5"]


# -- guarantee 12: decisions are journaled once and adopted by every later reader -----------


def test_a_journaled_decision_is_never_overwritten_and_later_writers_adopt_it(
    harness: Harness,
) -> None:
    run = harness.start("routed", {"amounts": [150]})
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    db = harness.engine.db
    adopted = queries.journal_decision(db, run.id, "branch:1", "small", get_clock().now())
    assert adopted == "big"
    assert queries.load_decision(db, run.id, "branch:1") == ("big",)


def test_a_branch_selector_is_evaluated_once_per_run(sqlite_harness: Harness) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def fickle(ctx: Any) -> str:
        with lock:
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("the selector's inputs changed since it was first asked")
        return "long"

    fwd = sqlite_harness.test_app.forward
    sqlite_harness.engine.register(
        Saga("fickle_route")
        .branch(
            "route",
            fickle,
            path("long", step("l1", fwd), step("l2", fwd), step("l3", fwd)),
            path("short", step("s", fwd)),
        )
        .step("after", fwd)
    )
    execution = sqlite_harness.start("fickle_route").wait(30)
    assert execution.state is ExecutionState.COMPLETED, execution.failure_reason
    assert [r.name for r in execution.steps] == ["l1", "l2", "l3", "after"]
    assert len(calls) == 1
    with sqlite_harness.engine.db.transaction() as connection:
        keys = connection.execute(
            select(decisions.c.key).where(decisions.c.execution_id == execution.id)
        ).all()
    assert [k for (k,) in keys] == ["branch:0"]
