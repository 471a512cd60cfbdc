"""A live holder keeps its claim; a cut-off one stops its body first (guarantee 30).

Real prefork workers and beat, the store behind a cuttable TCP proxy. The ledger bypasses
the proxy: ``forward_begin`` marks each execution's start, ``tick`` marks it alive every
0.2 s, ``forward`` its end. Two executions of one step must never interleave.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState
from celery_saga.decisions.takeover import Answer, Takeover, decide_takeover
from celery_saga.inspect.text import run_lines
from celery_saga.store import history
from tests.conftest import (
    BROKERS,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    client_app,
    require_services,
    spawn_beat,
    stop_workers,
)
from tests.faults import CuttableProxy
from tests.test_crash_recovery import step_running, wait_for
from tests.test_faults import FaultRig

pytestmark = pytest.mark.services


# -- the rule ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("live", "answer", "expected"),
    [
        (True, Answer.HELD, Takeover.LEAVE),
        (True, Answer.SILENT, Takeover.LEAVE),  # maybe cut off from the broker alone
        (True, Answer.NO_CHANNEL, Takeover.LEAVE),
        (True, Answer.UNASKED, Takeover.LEAVE),
        (True, Answer.ABSENT, Takeover.TAKE_OVER),
        (True, Answer.STOPPED, Takeover.TAKE_OVER_FENCED),
        (False, Answer.HELD, Takeover.LEAVE),  # the outage is over and it renewed
        (False, Answer.UNSTOPPABLE, Takeover.LEAVE),
        (False, Answer.UNASKED, Takeover.LEAVE),
        (False, Answer.ABSENT, Takeover.TAKE_OVER),
        (False, Answer.SILENT, Takeover.TAKE_OVER),
        (False, Answer.NO_CHANNEL, Takeover.TAKE_OVER),
        (False, Answer.STOPPED, Takeover.TAKE_OVER_FENCED),
    ],
)
def test_a_claim_is_taken_over_only_on_its_holders_word_or_silence_past_its_lease(
    live: bool, answer: Answer, expected: Takeover
) -> None:
    assert decide_takeover(live, answer) is expected


# -- helpers ----------------------------------------------------------------------------
def body_started(rig: Any, execution_id: str) -> Any:
    """Whether a body of the run has written its first mark (its claim is made and its
    context read: a cut from then on meets only the heartbeat and the outcome)."""
    return lambda: any(e.direction == "tick" for e in rig.client.entries(execution_id))


def attempts_of(rig: Any, execution_id: str) -> list[tuple[int, str]]:
    """(ledger id, attempt) of every mark, in the order they were written."""
    return [
        (entry.id, entry.detail)
        for entry in rig.client.entries(execution_id)
        if entry.direction in ("forward_begin", "tick", "forward")
    ]


def assert_never_interleaved(marks: list[tuple[int, str]]) -> None:
    """Every mark of an attempt comes before every mark of the next one."""
    order = [attempt for _, attempt in marks]
    seen: list[str] = []
    for attempt in order:
        if not seen or seen[-1] != attempt:
            assert attempt not in seen, f"attempts interleave: {order}"
            seen.append(attempt)


# -- a store outage longer than the lease -------------------------------------------------
def test_a_store_outage_longer_than_the_lease_leaves_the_running_body_to_its_holder(
    tmp_path: Path,
) -> None:
    """Free slots and a sweep every second: without the holder's answer the recovered
    message would take the lapsed claim over the moment the store is back."""
    rig = FaultRig(tmp_path, lease="3", recover_after="3", sweep="1")
    try:
        plan = {"marathon": {"sleep": 16, "mark_begin": True, "tick": True}}
        run = rig.client.engine.start("long", {"order": 1, "plan": plan})
        wait_for(body_started(rig, run.id), timeout=30)
        rig.proxy.cut(10)  # > lease + recover_after: the claim lapses in the store's eyes
        rig.proxy.wait_restored()
        execution = rig.wait_terminal(run.id, timeout=90)
        assert execution.state is ExecutionState.COMPLETED
        begins = [e for e in rig.client.entries(run.id) if e.direction == "forward_begin"]
        assert len(begins) == 1, "the body was started again while its holder ran it"
        assert execution.step("marathon").attempts == 1
        assert rig.ledger(run.id, "forward") == {f"{run.id}:marathon:0:forward": 1}
        rows = [(h.kind, h.attempt) for h in history.load(rig.client.engine.db, run.id)]
        attempt_rows = [r for r in rows if r[0].startswith("step-")]
        assert attempt_rows == [("step-completed", 1)], "no takeover, no lost attempt"
    finally:
        rig.close()


# -- one worker cut off from the store -----------------------------------------------------
class PartitionRig:
    """Worker A reaches the store through its own proxy; worker B and beat directly; both
    run ``app`` (with ``extra`` in their environment)."""

    def __init__(
        self, tmp: Path, app: str = "tests.sagaapp:app", extra: dict[str, str] | None = None
    ) -> None:
        require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
        self.tmp, self.queue = tmp, f"saga-part-{uuid.uuid4().hex[:10]}"
        direct = _test_database_url()
        self.proxy = CuttableProxy(5432)
        base = {
            **os.environ,
            "SAGA_TEST_BROKER": BROKERS["postgres-rabbitmq"],
            "SAGA_TEST_LEDGER": direct,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_DUPLICATE": "0",
            "SAGA_TEST_LEASE": "3",
            "SAGA_TEST_RECOVER_AFTER": "3",
            "SAGA_TEST_SWEEP_INTERVAL": "1",
            "PYTHONPATH": str(Path.cwd()),
            **(extra or {}),
        }
        self.app = app
        self.env_a = {**base, "SAGA_TEST_STORE": direct.replace(":5432", f":{self.proxy.port}")}
        self.env_b = {**base, "SAGA_TEST_STORE": direct}
        self.client = client_app(self.env_b, BROKERS["postgres-rabbitmq"], direct, self.queue)
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        self.workers, _ = _spawn_workers(self.env_a, self.queue, tmp / "a", count=1, app=app)
        _wait_ready(self.client, 1, self.workers)
        self.beat = spawn_beat(self.env_b, tmp)

    def start_b(self) -> None:
        """Worker B, on the same queue under another node name."""
        workers, _ = _spawn_workers(
            self.env_b, self.queue, self.tmp / "b", 1, prefix="b", app=self.app
        )
        self.workers.extend(workers)

    def close(self) -> None:
        stop_workers([*self.workers, self.beat])
        self.proxy.close()


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[PartitionRig]:
    rig = PartitionRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def test_a_worker_cut_off_from_the_store_stops_its_body_before_the_step_runs_elsewhere(
    partition: PartitionRig,
) -> None:
    rig = partition
    plan = {"marathon": {"sleep": 25, "mark_begin": True, "tick": True, "fenced": True}}
    run = rig.client.engine.start("long", {"order": 2, "plan": plan})
    wait_for(body_started(rig, run.id), timeout=30)
    holder = run.get().step("marathon").holder
    assert holder is not None and holder.startswith("w0-"), holder
    rig.start_b()
    rig.proxy.cut(40)  # A alone loses the store; B and beat keep it
    deadline = time.monotonic() + 60
    while run.get().state is not ExecutionState.COMPLETED:
        assert time.monotonic() < deadline, f"run did not complete: {run.get()}"
        time.sleep(0.25)
    marks = attempts_of(rig, run.id)
    assert_never_interleaved(marks)
    attempts = {attempt for _, attempt in marks}
    assert attempts == {"attempt=1", "attempt=2"}, attempts
    assert [d for _, d in marks if d == "attempt=1"], "attempt 1 ran before the cut"
    forward = [e.detail for e in rig.client.entries(run.id) if e.direction == "forward"]
    assert forward == ["attempt=2"], "the stopped body never finished; the second did, once"
    key = f"{run.id}:marathon:0:forward"
    assert not rig.client.fenced_write(key, 1, "late write of attempt 1"), "stale token refused"
    assert rig.client.fenced_write(key, 2, "attempt 2 again")


# -- a pool process that dies ----------------------------------------------------------------
def test_a_killed_pool_process_runs_its_step_again_within_seconds(tmp_path: Path) -> None:
    """Library default lease (30 s): the step must not wait for it."""
    rig = FaultRig(tmp_path, lease="30", recover_after="45", sweep="5")
    try:
        plan = {"marathon": {"sleep": 6, "mark_begin": True}}
        run = rig.client.engine.start("long", {"order": 3, "plan": plan})
        wait_for(step_running(run, "marathon"), timeout=30)
        wait_for(lambda: bool(rig.ledger(run.id, "forward_begin")), timeout=30)
        holder = run.get().step("marathon").holder
        assert holder is not None
        pid = int(holder.rsplit("/", 2)[1])
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def started_again() -> bool:
            begins = [e for e in rig.client.entries(run.id) if e.direction == "forward_begin"]
            return len(begins) >= 2

        wait_for(started_again, timeout=30)
        assert time.monotonic() - killed_at < 5, "the step waited for its lease"
        execution = rig.wait_terminal(run.id, timeout=60)
        assert execution.state is ExecutionState.COMPLETED
        assert execution.step("marathon").attempts == 2
    finally:
        rig.close()


def test_history_keeps_the_outcome_of_a_body_whose_claim_was_taken_over(
    tmp_path: Path,
) -> None:
    """Even with every precaution (a holder cut off from both broker and store is taken
    over once silent), a body can finish after its takeover: its result is kept on the
    run's history, and the step is not failed for it."""
    from tests.sagaapp import TestApp as App

    require_services(PORTS["postgres"])
    app = App("memory://", _test_database_url(), f"q-{uuid.uuid4().hex[:8]}")
    engine = app.engine
    from celery_saga import Saga
    from celery_saga.store import forward, queries

    def takes_long(ctx: Any) -> str:
        # Another worker takes the claim over while this body runs.
        record = queries.load_step(engine.db, ctx.execution_id, "slow")
        execution = queries.load_execution(engine.db, ctx.execution_id)
        assert record is not None and execution is not None
        forward.claim_step(
            engine.db,
            execution_id=ctx.execution_id,
            name="slow",
            node=0,
            sub=0,
            definition_hash=execution.definition_hash,
            idempotency_key=record.idempotency_key,
            compensatable=False,
            lease_expires_at=record.lease_expires_at,
            now=record.lease_expires_at,
            existing=record,
            holder="elsewhere/1/x",
        )
        return "first body's result"

    name = f"late{uuid.uuid4().hex[:6]}"
    engine.register(Saga(name).step("slow", takes_long))
    app.app.conf.task_always_eager = True
    run = engine.start(name, {})
    entries = [e for e in history.load(engine.db, run.id) if e.kind != "started"]
    assert [(e.kind, e.step, e.attempt, e.data) for e in entries] == [
        ("step-lost", "slow", 1, None),
        ("late-outcome", "slow", 1, "first body's result"),
    ]
    assert run.get().step("slow").status.value == "running", "not failed, not completed"
    shown = run_lines(engine.inspect().run(run.id, reveal=True))
    assert any("late-outcome" in line and "taken over" in line for line in shown), shown
    assert any("held by elsewhere/1/x" in line for line in shown), shown


def test_a_killed_worker_is_known_gone_without_waiting_for_its_answer(tmp_path: Path) -> None:
    """The whole worker SIGKILLed (main process too): on RabbitMQ its remote-control queue
    goes with its connection, so the taker does not wait out the question's 10 s."""
    rig = FaultRig(tmp_path, lease="3", recover_after="3", sweep="1")
    try:
        plan = {"marathon": {"sleep": 6, "mark_begin": True}}
        run = rig.client.engine.start("long", {"order": 4, "plan": plan})
        wait_for(lambda: bool(rig.ledger(run.id, "forward_begin")), timeout=30)
        holder = run.get().step("marathon").holder
        assert holder is not None
        node = holder.rsplit("/", 2)[0]
        worker = next(w for w in rig.workers if node.split("-", 1)[0] in _worker_name(w))
        killed_at = time.monotonic()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)

        def started_again() -> bool:
            begins = [e for e in rig.client.entries(run.id) if e.direction == "forward_begin"]
            return len(begins) >= 2

        wait_for(started_again, timeout=40)
        # lease 3 s + recover_after 3 s + a sweep (1 s) + delivery; not + 10 s of asking
        assert time.monotonic() - killed_at < 13
        assert rig.wait_terminal(run.id, timeout=60).state is ExecutionState.COMPLETED
    finally:
        rig.close()


def _worker_name(worker: Any) -> str:
    """The ``-n`` node name a test worker was started with."""
    args = list(worker.args)
    return str(args[args.index("-n") + 1])
