"""Lost messages are recovered by the sweep (beat, worker start-up, or engine.recover)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.decisions.recovery import RecoveryKind, decide_recovery
from celery_saga.records import ExecutionRecord, StepRecord, StepStatus
from tests.conftest import Harness

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def _drop_once(
    monkeypatch: pytest.MonkeyPatch, harness: Harness, method: str, matches: Any
) -> list[Any]:
    publisher = harness.engine.executor.publisher
    real = getattr(publisher, method)
    dropped: list[Any] = []

    def lossy(*args: Any, **kwargs: Any) -> None:
        if not dropped and matches(*args):
            dropped.append(args)
            return
        real(*args, **kwargs)

    monkeypatch.setattr(publisher, method, lossy)
    return dropped


def _idle_until(harness: Harness, execution_id: str, state: ExecutionState) -> None:
    deadline = time.monotonic() + 10
    while harness.engine.get(execution_id).state is not state:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)


def test_a_lost_node_message_is_republished_and_each_step_runs_once(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped = _drop_once(
        monkeypatch,
        sqlite_harness,
        "publish_node",
        lambda saga, spec, message, *rest: message.node == 2,
    )
    run = sqlite_harness.start("five", {"order": 40})
    _idle_until(sqlite_harness, run.id, ExecutionState.RUNNING)
    assert dropped and run.get().record.cursor == 2
    assert sqlite_harness.engine.recover(stale_after=0.2) >= 1  # other tests' idle runs too
    assert run.wait(30).state is ExecutionState.COMPLETED
    forward = [e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "forward"]
    assert forward == ["s1", "s2", "s3", "s4", "s5"]


def test_a_lost_reversal_message_is_republished_and_reversed_once(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped = _drop_once(
        monkeypatch,
        sqlite_harness,
        "publish_compensation",
        lambda saga, spec, execution_id, step, *rest: step == "s2",
    )
    run = sqlite_harness.start("five", {"order": 41, "plan": {"s4": {"fail": True}}})
    _idle_until(sqlite_harness, run.id, ExecutionState.COMPENSATING)
    assert dropped
    assert sqlite_harness.engine.recover(stale_after=0.2) >= 1
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = [
        e.step for e in sqlite_harness.test_app.entries(run.id) if e.direction == "compensate"
    ]
    assert undone == ["s3", "s2", "s1"]


def test_a_run_whose_step_is_still_in_flight_is_left_alone(sqlite_harness: Harness) -> None:
    run = sqlite_harness.start("five", {"order": 42, "plan": {"s1": {"sleep": 1.5}}})
    time.sleep(0.5)
    sqlite_harness.engine.recover(stale_after=0.2)
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED
    assert len([e for e in sqlite_harness.test_app.entries(run.id) if e.step == "s1"]) == 1
    assert execution.step("s1").attempts == 1, "the step in flight was not claimed again"


def _run(state: ExecutionState, idle: float, cursor: int = 1) -> ExecutionRecord:
    stamp = NOW - timedelta(seconds=idle)
    return ExecutionRecord(
        "r", "five", "h", state, cursor, 0, {}, None, None, None, None, None, 3, stamp, stamp
    )


def _step(
    name: str,
    status: StepStatus,
    lease: float | None = None,
    node: int = 1,
    attempts: int = 1,
    record_id: int = 1,
) -> StepRecord:
    expiry = None if lease is None else NOW + timedelta(seconds=lease)
    return StepRecord(
        record_id,
        "r",
        name,
        node,
        0,
        status,
        attempts,
        f"r:{name}:0:forward",
        True,
        lease_expires_at=expiry,
    )


@pytest.mark.parametrize(
    ("run", "steps", "kind"),
    [
        (_run(ExecutionState.RUNNING, idle=5), [], RecoveryKind.NOTHING),
        (_run(ExecutionState.RUNNING, idle=120), [], RecoveryKind.REPUBLISH_POSITION),
        (
            _run(ExecutionState.RUNNING, idle=120),
            [_step("a", StepStatus.RUNNING, lease=30)],
            RecoveryKind.NOTHING,
        ),
        (
            _run(ExecutionState.RUNNING, idle=120),
            [_step("a", StepStatus.RUNNING, lease=-1)],
            RecoveryKind.REPUBLISH_POSITION,
        ),
        (_run(ExecutionState.COMPLETED, idle=999), [], RecoveryKind.NOTHING),
        (
            _run(ExecutionState.COMPENSATING, idle=120),
            [_step("a", StepStatus.COMPLETED)],
            RecoveryKind.REPUBLISH_COMPENSATION,
        ),
        (_run(ExecutionState.COMPENSATING, idle=120), [], RecoveryKind.REPLAN_UNWIND),
    ],
)
def test_recovery_decision(
    run: ExecutionRecord, steps: list[StepRecord], kind: RecoveryKind
) -> None:
    assert decide_recovery(run, steps, {"a"}, NOW, timedelta(seconds=60)).kind is kind


def test_a_pending_retry_is_republished_for_exactly_its_next_attempt() -> None:
    decision = decide_recovery(
        _run(ExecutionState.RUNNING, idle=120),
        [_step("a", StepStatus.PENDING, attempts=2)],
        {"a"},
        NOW,
        timedelta(seconds=60),
    )
    assert decision.retries == (("a", 3),)


def test_runs_left_alone_do_not_hide_a_lost_one_behind_them(tmp_path: Any) -> None:
    from celery import Celery

    from celery_saga import Saga, SagaEngine, set_clock
    from celery_saga.store import forward
    from celery_saga.testing import ControlledClock

    clock = ControlledClock(NOW)
    previous = set_clock(clock)
    try:
        app = Celery("starve", broker="memory://localhost/", set_as_current=False)
        engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/starve.sqlite3")
        definition = engine.register(Saga("idle").step("a", lambda: None))[0]
        runs = [engine.start("idle") for _ in range(3)]
        for run in runs[:2]:  # two runs whose step is in flight for an hour
            forward.claim_step(
                engine.db,
                execution_id=run.id,
                name="a",
                node=0,
                sub=0,
                definition_hash=definition.hash,
                idempotency_key=f"{run.id}:a:0:forward",
                compensatable=False,
                lease_expires_at=NOW + timedelta(hours=1),
                now=NOW,
                existing=None,
            )
        clock.advance(120)
        acted = engine.recoverer.sweep(timedelta(seconds=60), page=1)
        assert acted == 1, "the lost run behind the in-flight ones is recovered"
    finally:
        set_clock(previous)


def _put_whole_files(monkeypatch: Any) -> None:
    """kombu's ``filesystem://`` writer creates a message file, then fills it, while its
    reader takes any file it lists: a worker polling every 10 ms can read a file before its
    bytes are there, and dies on the empty JSON (celery/kombu#1551). Write each file aside
    and rename it into place, so the reader only ever sees whole messages."""
    import json
    import os

    from kombu.transport import filesystem

    def put_whole(channel: Any, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(channel.data_folder_out, name)
        with open(f"{path}.partial", "w") as partial:
            json.dump(payload, partial)
        os.replace(f"{path}.partial", path)

    monkeypatch.setattr(filesystem.Channel, "_put", put_whole)


@pytest.mark.parametrize("transport", ["memory", "filesystem"])
def test_a_message_the_transport_dropped_is_recovered(
    transport: str, tmp_path: Any, monkeypatch: Any
) -> None:
    from celery import Celery

    from celery_saga import Saga, SagaEngine
    from celery_saga.worker.embedded import embedded_worker

    ran: list[str] = []
    app = Celery(f"drop-{transport}", set_as_current=False)
    queue = f"drop-{transport}-{tmp_path.name}"
    if transport == "memory":
        app.conf.broker_url = "memory://localhost/"
        app.conf.broker_transport_options = {"polling_interval": 0.01}
    else:
        _put_whole_files(monkeypatch)
        folder = tmp_path / "broker"
        folder.mkdir()
        app.conf.broker_url = "filesystem://"
        app.conf.broker_transport_options = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),
            "polling_interval": 0.01,
        }
    app.conf.task_default_queue = queue
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/drop.sqlite3")
    engine.register(
        Saga("dropped").step("a", lambda: ran.append("a")).step("b", lambda: ran.append("b"))
    )
    run = engine.start("dropped")
    with app.connection_for_write() as connection:  # the transport loses what it held
        assert connection.default_channel.queue_purge(queue) == 1
    with embedded_worker(app, concurrency=1):
        time.sleep(0.3)
        assert run.get().steps == (), "nothing drives the run now"
        assert engine.recover(stale_after=0) == 1
        assert run.wait(30).state is ExecutionState.COMPLETED
    assert ran == ["a", "b"]


def test_a_run_recorded_failed_before_its_unwind_started_is_unwound_by_the_sweep(
    direct: Any,
) -> None:
    from sqlalchemy import update

    from celery_saga import Saga
    from celery_saga.decisions.admission import NodeMessage
    from celery_saga.store.tables import executions

    undone: list[str] = []
    saga = f"owed{uuid.uuid4().hex[:6]}"
    direct.register(
        Saga(saga)
        .step("a", lambda: "a", compensate=lambda: undone.append("a"))
        .step("b", lambda: "b")
    )
    run = direct.start(saga)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    with direct.db.transaction() as connection:  # failed, with no unwind begun or planned
        connection.execute(
            update(executions)
            .where(executions.c.id == run.id)
            .values(state="failed", failure_reason="RuntimeError: lost in a crash")
        )
    assert direct.recover(stale_after=0) >= 1
    execution = direct.get(run.id)
    assert execution.state is ExecutionState.COMPENSATING
    direct.executor.unwinder.run(run.id, "a", 1)
    execution = direct.get(run.id)
    assert (execution.state, execution.rollback_status) == (
        ExecutionState.FAILED,
        RollbackStatus.COMPLETED,
    )
    assert execution.failure_reason == "RuntimeError: lost in a crash", "the cause is kept"
    assert undone == ["a"]
