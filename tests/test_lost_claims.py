"""A claim the store lost is written back by its live holder (guarantee 30).

A database crash or a failover to a replica that never received it undoes a claim's commit
while its body runs on. Here the loss is made exactly where it matters: the body itself
deletes its claim (a first claim's INSERT undone) or turns it back to what it was before
(a retry's or a reversal's claim undone). The holder's renewal or its outcome then finds no
claim of its own and no other holder: it writes the claim back and records the outcome as
the step's, never as a late outcome, and the recovery sweep leaves the run to it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, update

from celery_saga import ExecutionState, RollbackStatus, Saga, SagaContext
from celery_saga.decisions.lost_claims import ClaimFound, ClaimState, claim_state
from celery_saga.decisions.recovery import Recovery, RecoveryKind, left_to_running
from celery_saga.records import Attempt, StepStatus
from celery_saga.store import claims, forward, history, queries, recovery
from celery_saga.store.tables import executions, step_records
from tests.sagaapp import TestApp
from tests.test_decisions import NOW, execution, record

OTHER = "elsewhere@host/1/x"


# -- the rule ---------------------------------------------------------------------------
def found(attempts: int, holder: str | None = "me", **flags: bool) -> ClaimFound:
    values = {"running": True, "open": True, "owed": True, **flags}
    return ClaimFound(attempts=attempts, holder=holder, **values)


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (found(2), ClaimState.HELD),
        (found(2, holder=OTHER), ClaimState.TAKEN),  # the same number, claimed after a loss
        (found(3, holder=None), ClaimState.TAKEN),
        (found(2, running=False, open=False), ClaimState.ENDED),  # its outcome is recorded
        (found(1, holder=None, running=False), ClaimState.LOST),  # back as before its claim
        (found(1, holder=OTHER), ClaimState.LOST),  # a takeover's claim undone
        (found(1, running=False, open=False), ClaimState.ENDED),
        (found(1, owed=False), ClaimState.ENDED),  # the run moved on: nothing to hold
        (found(0, holder=None, running=False), ClaimState.ENDED),  # two claims back: not ours
    ],
)
def test_a_failed_renewal_means_lost_only_when_nobody_claimed_since_and_the_step_is_owed(
    seen: ClaimFound, expected: ClaimState
) -> None:
    assert claim_state(seen, 2, "me") is expected


@pytest.mark.parametrize(
    ("record_holder", "running", "left"),
    [
        (None, set(), False),  # nobody runs it: send it again
        (None, {"w1@h/7/t"}, True),  # runs on a claim the store lost
        ("w1@h/7/t", {"w1@h/7/t"}, False),  # its own holder, lease lapsed: asked and fenced
        ("w1@h/7/t", {"w2@h/9/u"}, False),  # a claim is recorded: its holder is asked
    ],
)
def test_the_sweep_leaves_a_run_to_a_process_running_it_only_where_no_claim_is_recorded(
    record_holder: str | None, running: set[str], left: bool
) -> None:
    run = execution()  # live at node 2
    steps = []
    if record_holder is not None:
        held = {"status": StepStatus.RUNNING, "holder": record_holder, "lease_expires_at": NOW}
        steps = [record("charge", **held)]
    action = Recovery(RecoveryKind.REPUBLISH_POSITION)
    assert left_to_running(run, steps, action, running) is left


def test_a_first_claim_undone_is_lost_when_the_record_is_gone() -> None:
    gone = ClaimFound(attempts=0, holder=None, running=False, open=True, owed=True)
    assert claim_state(gone, 1, "me") is ClaimState.LOST
    assert claim_state(gone, 2, "me") is ClaimState.ENDED


# -- on each store, in one process --------------------------------------------------------
@pytest.fixture
def eager(store_url: str) -> Iterator[TestApp]:
    app = TestApp("memory://", store_url, f"q-{uuid.uuid4().hex[:8]}")
    app.app.conf.task_always_eager = True
    app.engine.ensure_schema()
    try:
        yield app
    finally:
        app.engine.db.dispose()


def _lose_first_claim(app: TestApp, execution_id: str, name: str) -> None:
    """What a crash does to a first claim committed without its flush: no record at all."""
    with app.engine.db.transaction() as connection:
        connection.execute(
            delete(step_records).where(
                step_records.c.execution_id == execution_id, step_records.c.name == name
            )
        )


def _rewind(app: TestApp, execution_id: str, name: str, **before: Any) -> None:
    """What a crash does to a later claim committed without its flush: the record as it
    was before that claim (``before``: its columns then)."""
    with app.engine.db.transaction() as connection:
        connection.execute(
            update(step_records)
            .where(step_records.c.execution_id == execution_id, step_records.c.name == name)
            .values(lease_expires_at=None, **before)
        )


def _kinds(app: TestApp, execution_id: str) -> list[tuple[str, str | None, int | None]]:
    rows = history.load(app.engine.db, execution_id)
    return [(e.kind, e.step, e.attempt) for e in rows if e.kind != "started"]


def test_an_outcome_whose_first_claim_the_store_lost_is_recorded_as_the_steps(
    eager: TestApp, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    def charge(ctx: SagaContext) -> str:
        ran.append(ctx.attempt)
        _lose_first_claim(eager, ctx.execution_id, "charge")
        return "charged"

    name = f"lost{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("charge", charge).step("ship", lambda ctx: "sent"))
    with caplog.at_level(logging.WARNING, logger="celery_saga"):
        run = eager.engine.start(name, {})
    execution = run.get()
    assert ran == [1]
    assert execution.state is ExecutionState.COMPLETED
    assert execution.step("charge").result == "charged"
    assert ("claim-restored", "charge", 1) in _kinds(eager, run.id)
    assert not any(kind == "late-outcome" for kind, _, _ in _kinds(eager, run.id))
    restored = [r for r in caplog.records if "store lost the claim" in r.getMessage()]
    assert len(restored) == 1 and "wrote it back" in restored[0].getMessage()
    assert not any("taken over" in r.getMessage() for r in caplog.records)


def test_a_retry_whose_claim_the_store_lost_is_written_back_on_what_was_there(
    eager: TestApp,
) -> None:
    ran: list[int] = []

    def flaky(ctx: SagaContext) -> str:
        ran.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("provider down")
        # The retry's claim undone: the record as the first attempt's outcome left it.
        _rewind(eager, ctx.execution_id, "flaky", status="pending", attempts=1, holder=None)
        return "done"

    name = f"lostretry{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("flaky", flaky, retry=2, backoff=0.01))
    run = eager.engine.start(name, {})
    execution = run.get()
    assert ran == [1, 2]
    assert execution.state is ExecutionState.COMPLETED
    assert execution.step("flaky").attempts == 2
    assert ("claim-restored", "flaky", 2) in _kinds(eager, run.id)


def test_a_body_whose_step_another_process_claimed_after_the_loss_keeps_a_late_outcome(
    eager: TestApp, caplog: pytest.LogCaptureFixture
) -> None:
    def slow(ctx: SagaContext) -> str:
        record = queries.load_step(eager.engine.db, ctx.execution_id, "slow")
        assert record is not None
        _lose_first_claim(eager, ctx.execution_id, "slow")
        columns = {c.name: getattr(record, c.name, None) for c in step_records.c}
        columns.update(id=None, status="running", holder=OTHER, idempotency_key=ctx.idempotency_key)
        with eager.engine.db.transaction() as connection:
            values = {k: v for k, v in columns.items() if v is not None and k != "result"}
            connection.execute(insert(step_records).values(values))
        return "first body's result"

    name = f"losttaken{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("slow", slow))
    with caplog.at_level(logging.WARNING, logger="celery_saga"):
        run = eager.engine.start(name, {})
    assert run.get().step("slow").status.value == "running", "left to the other holder"
    assert [k for k, _, _ in _kinds(eager, run.id)] == ["late-outcome"]
    late = [r.getMessage() for r in caplog.records if "finished after" in r.getMessage()]
    assert len(late) == 1 and "taken over" in late[0], late


def test_a_reversal_whose_claim_the_store_lost_is_written_back_and_recorded(
    eager: TestApp,
) -> None:
    undone: list[int] = []

    def undo(ctx: SagaContext) -> None:
        undone.append(ctx.attempt)
        _rewind(  # the reversal's claim undone
            eager,
            ctx.execution_id,
            "reserve",
            compensation_attempts=step_records.c.compensation_attempts - 1,
            compensation_lease_expires_at=None,
            compensation_holder=None,
        )

    def refuse(ctx: SagaContext) -> None:
        raise ValueError("card declined")

    name = f"lostundo{uuid.uuid4().hex[:6]}"
    eager.engine.register(
        Saga(name).step("reserve", lambda ctx: "held", compensate=undo).step("charge", refuse)
    )
    run = eager.engine.start(name, {})
    execution = run.get()
    assert undone == [1]
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert ("claim-restored", "reserve", 1) in _kinds(eager, run.id)


def test_an_outcome_meeting_a_claim_its_heartbeat_wrote_back_first_is_recorded(
    eager: TestApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome write and the lease's heartbeat both meet the loss; the heartbeat writes
    the claim back first, between the outcome's refused write and its own look: the claim
    is this attempt's again, so the outcome is written, not kept as a late one."""
    real = forward.record_step_completed
    calls: list[bool] = []

    def refused_then_heartbeat(db: Any, step: Attempt, **kwargs: Any) -> bool:
        if calls:
            calls.append(real(db, step, **kwargs))
            return calls[-1]
        calls.append(False)  # refused: the claim is gone; now the heartbeat writes it back
        assert eager.engine.executor.lost_claims.step(step, True) is ClaimState.RESTORED
        return False

    def charge(ctx: SagaContext) -> str:
        _lose_first_claim(eager, ctx.execution_id, "charge")
        return "charged"

    monkeypatch.setattr(forward, "record_step_completed", refused_then_heartbeat)
    name = f"lostrace{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("charge", charge))
    run = eager.engine.start(name, {})
    assert calls == [False, True]
    assert run.get().state is ExecutionState.COMPLETED
    assert "late-outcome" not in [k for k, _, _ in _kinds(eager, run.id)]


def test_a_reversal_retry_whose_claim_the_store_lost_is_counted_and_runs_again(
    eager: TestApp,
) -> None:
    undone: list[int] = []

    def undo(ctx: SagaContext) -> None:
        undone.append(ctx.attempt)
        if ctx.attempt == 1:
            _rewind(  # the first reversal attempt's claim undone, then it fails
                eager,
                ctx.execution_id,
                "reserve",
                compensation_attempts=0,
                compensation_lease_expires_at=None,
                compensation_holder=None,
            )
            raise ConnectionError("warehouse down")

    def refuse(ctx: SagaContext) -> None:
        raise ValueError("card declined")

    name = f"lostundoretry{uuid.uuid4().hex[:6]}"
    saga = Saga(name).step(
        "reserve", lambda ctx: "held", compensate=undo, compensation_retry=2, backoff=0.01
    )
    eager.engine.register(saga.step("charge", refuse))
    run = eager.engine.start(name, {})
    execution = run.get()
    assert undone == [1, 2]
    assert execution.rollback_status is RollbackStatus.COMPLETED
    kinds = _kinds(eager, run.id)
    assert ("claim-restored", "reserve", 1) in kinds
    assert ("reversal-retrying", "reserve", 1) in kinds


def test_a_holders_claim_ends_nothing_another_process_claimed_under_the_same_number(
    eager: TestApp,
) -> None:
    """After a loss, another process claimed the same attempt number: this holder's give-up,
    reversal release and reversal outcome match nothing of the other's."""
    seen: dict[str, Any] = {}

    def undo(ctx: SagaContext) -> None:
        db = eager.engine.db
        _rewind(eager, ctx.execution_id, "reserve", compensation_holder=OTHER)
        mine = Attempt.reversal(ctx.execution_id, "reserve", ctx.attempt, None, "mine/1/x")
        now = datetime.now(timezone.utc)
        seen["released"] = claims.release(db, mine, reason="r", now=now)
        seen["given_up"] = claims.give_up(db, mine, now=now, why="its worker is shutting down")
        seen["record"] = queries.load_step(db, ctx.execution_id, "reserve")

    def refuse(ctx: SagaContext) -> None:
        raise ValueError("card declined")

    name = f"lostsame{uuid.uuid4().hex[:6]}"
    eager.engine.register(
        Saga(name).step("reserve", lambda ctx: "held", compensate=undo).step("charge", refuse)
    )
    run = eager.engine.start(name, {})
    assert seen["released"] is False and seen["given_up"] is False
    assert seen["record"].compensation_holder == OTHER
    assert run.get().step("reserve").compensation_status is None, "the other holder's"
    record = queries.load_step(eager.engine.db, run.id, "reserve")
    assert record is not None
    step = Attempt(run.id, "reserve", 0, 0, record.attempts, None, "mine/1/x")
    with eager.engine.db.transaction() as connection:
        connection.execute(
            update(step_records)
            .where(step_records.c.execution_id == run.id, step_records.c.name == "reserve")
            .values(status="running", holder=OTHER)
        )
    now = datetime.now(timezone.utc)
    assert claims.give_up(eager.engine.db, step, now=now, why="w") is False


def test_a_worker_main_process_asked_about_a_lost_claim_keeps_it_for_its_body(
    eager: TestApp,
) -> None:
    """The main process knows neither the attempt's position nor what its claim stored:
    a lost claim is LOST there (answered held; the body's heartbeat writes it back), never
    ENDED because the run is not at node 0."""
    states: list[ClaimState] = []

    def ship(ctx: SagaContext) -> str:
        _lose_first_claim(eager, ctx.execution_id, "ship")
        attempt = Attempt(ctx.execution_id, "ship", 0, 0, 1, None, "w@h/1/t")
        states.append(eager.engine.executor.lost_claims.step(attempt, None))
        return "sent"

    name = f"lostmain{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("pack", lambda ctx: "packed").step("ship", ship))
    eager.engine.start(name, {})
    assert states == [ClaimState.LOST]


def test_the_heartbeat_writes_back_a_claim_the_store_lost_while_the_body_runs(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = 0.9  # renewed every 0.3 s
    monkeypatch.setenv("SAGA_TEST_LEASE", str(lease))
    app = TestApp("memory://", store_url, f"q-{uuid.uuid4().hex[:8]}")
    app.app.conf.task_always_eager = True
    seen: list[Any] = []

    def long_body(ctx: SagaContext) -> str:
        _lose_first_claim(app, ctx.execution_id, "long")
        deadline = time.monotonic() + 5  # renewed every 0.3 s once the heartbeat wakes
        record = None
        while record is None and time.monotonic() < deadline:
            time.sleep(0.1)
            record = queries.load_step(app.engine.db, ctx.execution_id, "long")
        seen.append(record)
        return "ok"

    name = f"lostbeat{uuid.uuid4().hex[:6]}"
    app.engine.register(Saga(name).step("long", long_body))
    try:
        with caplog.at_level(logging.WARNING, logger="celery_saga"):
            run = app.engine.start(name, {})
        assert seen[0] is not None and seen[0].status.value == "running", seen
        assert seen[0].attempts == 1 and seen[0].holder is not None
        assert run.get().state is ExecutionState.COMPLETED
        assert _kinds(app, run.id).count(("claim-restored", "long", 1)) == 1
        assert sum("store lost the claim" in r.getMessage() for r in caplog.records) == 1
    finally:
        app.engine.db.dispose()


# -- the recovery sweep leaves such a run alone -------------------------------------------
def test_the_sweep_leaves_a_run_whose_body_still_runs_here_without_a_claim(
    eager: TestApp,
) -> None:
    swept: list[int] = []

    def charge(ctx: SagaContext) -> str:
        _lose_first_claim(eager, ctx.execution_id, "charge")
        # The run looks idle with nothing claimed, as after a crash: the sweep must ask.
        swept.append(eager.engine.recover(stale_after=0))
        return "charged"

    name = f"lostsweep{uuid.uuid4().hex[:6]}"
    eager.engine.register(Saga(name).step("charge", charge))
    run = eager.engine.start(name, {})
    assert swept == [0]
    assert run.get().state is ExecutionState.COMPLETED
    assert "recovered" not in [k for k, _, _ in _kinds(eager, run.id)]


def test_the_sweep_waits_until_the_store_has_been_up_for_recover_after(store_url: str) -> None:
    app = TestApp("memory://", store_url, f"q-{uuid.uuid4().hex[:8]}")
    app.engine.ensure_schema()
    try:
        uptime = recovery.seconds_since_start(app.engine.db)
        if store_url.startswith("sqlite"):
            assert uptime is None
            return
        assert uptime is not None and uptime > 0
        name = f"stale{uuid.uuid4().hex[:6]}"
        app.engine.register(Saga(name).step("a", lambda ctx: "a"))
        run = app.engine.start(name, {})  # its message goes nowhere: no worker
        long_ago = queries.load_execution(app.engine.db, run.id)
        assert long_ago is not None
        with app.engine.db.transaction() as connection:
            connection.execute(
                update(executions)
                .where(executions.c.id == run.id)
                .values(updated_at=long_ago.updated_at - timedelta(days=3650))
            )
        # A store up for less than recover_after: nothing is sent again yet.
        assert app.engine.recover(stale_after=uptime + 3600) == 0
        assert app.engine.recover(stale_after=max(uptime - 5, 0)) >= 1
    finally:
        app.engine.db.dispose()


@pytest.mark.services
def test_a_sweep_asks_the_workers_and_leaves_a_body_running_on_a_lost_claim(
    tmp_path: Path,
) -> None:
    """A failover: the store has been up for long, so only the workers can say that a body
    still runs on a claim the store lost. Beat sweeps every second with recover_after 1 s;
    the lease (30 s) is not renewed before the body ends."""
    from tests.test_crash_recovery import crash_rig

    for rig in crash_rig("postgres-rabbitmq", tmp_path, lease=30, recover_after=1):
        rig.start_worker()
        plan = {"marathon": {"mark_begin": True, "lose_claim": True, "sleep": 6}}
        run = rig.client.engine.start("long", {"plan": plan})
        assert rig.drive_to_end(run.id, timeout=60).state is ExecutionState.COMPLETED
        begun = [e for e in rig.client.entries(run.id) if e.direction == "forward_begin"]
        assert len(begun) == 1, begun
        kinds = [e.kind for e in history.load(rig.client.engine.db, run.id)]
        assert "claim-restored" in kinds and "recovered" not in kinds, kinds
        logs = "".join(p.read_text() for p in tmp_path.glob("gen*/worker*.log"))
        assert "not recovered, " in logs and "still runs it" in logs
