"""Real worker processes killed with SIGKILL mid-step and mid-unwind (guarantees 2, 9, 10,
11, 15, 17), with a real `celery beat` sending the sweeps.

The killed worker's process group dies at once, as on a lost host. A fresh worker then
picks the run up: RabbitMQ redelivers the unacknowledged message (deferred until the dead
worker's lease expires); on Redis the recovery sweep from beat republishes it. The ledger
(a table the test's steps and compensations write, keyed by idempotency key) shows every
effect under one stable key, and no step or reversal applied twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionNotFoundError, ExecutionState, RollbackStatus
from celery_saga.store import history
from tests.conftest import (
    BROKERS,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    require_services,
    spawn_beat,
    stop_workers,
)
from tests.sagaapp import TestApp

LEASE = 3.0


class CrashRig:
    def __init__(
        self,
        broker: str,
        tmp: Path,
        lease: float = LEASE,
        recover_after: float = LEASE,
        store: str | None = None,
    ) -> None:
        self.queue = f"saga-crash-{uuid.uuid4().hex[:10]}"
        self.tmp = tmp
        store = store or _test_database_url()
        self.env = {
            **os.environ,
            "SAGA_TEST_BROKER": broker,
            "SAGA_TEST_STORE": store,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_DUPLICATE": "0",
            "SAGA_TEST_LEASE": str(lease),
            "SAGA_TEST_RECOVER_AFTER": str(recover_after),
            "SAGA_TEST_SWEEP_INTERVAL": "1",
            "PYTHONPATH": str(Path.cwd()),
        }
        os.environ["SAGA_TEST_LEASE"] = str(lease)
        try:
            self.client = TestApp(broker, store, self.queue)
        finally:
            del os.environ["SAGA_TEST_LEASE"]
        self.workers: list[subprocess.Popen[bytes]] = []
        self.generation = 0
        self.beat = spawn_beat(self.env, self.tmp)

    def start_worker(self, count: int = 1, concurrency: int = 2) -> subprocess.Popen[bytes]:
        """Start ``count`` workers of ``concurrency`` pool processes; returns the first."""
        self.generation += 1
        logdir = self.tmp / f"gen{self.generation}"
        logdir.mkdir()
        workers, _ = _spawn_workers(
            self.env, self.queue, logdir, count=count, concurrency=concurrency
        )
        self.workers.extend(workers)
        _wait_ready(self.client, count, workers)
        return workers[0]

    def kill(self, worker: subprocess.Popen[bytes]) -> None:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)

    def kill_and_restart_when(
        self, worker: subprocess.Popen[bytes], condition: Callable[[], bool]
    ) -> None:
        """SIGKILL ``worker`` once ``condition`` holds (and the body is well inside its
        sleep), then start a fresh worker in its place."""
        wait_for(condition)
        time.sleep(0.5)
        self.kill(worker)
        self.start_worker()

    def drive_to_end(self, execution_id: str, timeout: float = 90) -> Any:
        """Wait for the run; beat's sweeps are what moves it on after a crash."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            execution = self.client.engine.get(execution_id)
            if execution.state in (ExecutionState.COMPLETED, ExecutionState.FAILED):
                return execution
            time.sleep(0.5)
        logs = (self.tmp / "beat.log").read_text(errors="replace")[-2000:]
        raise AssertionError(f"run {execution_id} did not finish: {execution}\n{logs}")

    def close(self) -> None:
        stop_workers([*self.workers, self.beat])
        with self.client.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(self.queue)


def crash_rig(backend: str, tmp: Path, **settings: float) -> Iterator[CrashRig]:
    """A rig on ``backend`` ("postgres-rabbitmq" or "postgres-redis"), closed after use."""
    require_services(PORTS["postgres"], PORTS[backend])
    rig = CrashRig(BROKERS[backend], tmp, **settings)
    try:
        yield rig
    finally:
        rig.close()


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig(request.param, tmp_path)


def wait_for(condition: Callable[[], bool], timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def step_running(run: Any, name: str) -> Callable[[], bool]:
    """Whether step ``name`` of ``run`` is running (its attempt claimed, not settled)."""

    def running() -> bool:
        steps = {s.name: s for s in run.get().steps}
        return name in steps and steps[name].status.value == "running"

    return running


def reversal_claimed(run: Any, name: str) -> Callable[[], bool]:
    """Whether the reversal of step ``name`` of ``run`` has been claimed at least once."""

    def claimed() -> bool:
        steps = {s.name: s for s in run.get().steps}
        return name in steps and steps[name].compensation_attempts >= 1

    return claimed


def test_worker_killed_mid_step_resumes_without_repeating_effects(rig: CrashRig) -> None:
    # The steps keep Celery's default early ack: the killed worker's message is gone, and
    # only the claim, its lease and the recovery sweep bring the step back.
    app = rig.client.app
    assert not app.conf.task_acks_late
    assert not any(app.tasks[f"five.s{n}"].acks_late for n in range(3, 6))
    first = rig.start_worker()
    run = rig.client.engine.start("five", {"order": 50, "plan": {"s3": {"first_sleep": 6}}})

    rig.kill_and_restart_when(first, step_running(run, "s3"))
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.COMPLETED
    entries = rig.client.entries(run.id)
    forward = Counter(e.key for e in entries if e.direction == "forward")
    assert forward == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
    # The killed attempt never reached its effect; the one that took its claim over did.
    assert execution.step("s3").attempts == 2
    assert [e.detail for e in entries if e.step == "s3"] == ["attempt=2"]
    s3_rows = [h for h in history.load(rig.client.engine.db, run.id) if h.step == "s3"]
    assert [(h.kind, h.attempt) for h in s3_rows] == [("step-lost", 1), ("step-completed", 2)]


def test_worker_killed_mid_reversal_finishes_the_unwind_once_per_step(rig: CrashRig) -> None:
    first = rig.start_worker()
    plan = {"s4": {"fail": True}, "s2": {"undo_first_sleep": 6}}
    run = rig.client.engine.start("five", {"order": 51, "plan": plan})

    rig.kill_and_restart_when(first, reversal_claimed(run, "s2"))
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = [e for e in rig.client.entries(run.id) if e.direction == "compensate"]
    assert [e.step for e in undone] == ["s3", "s2", "s1"]
    assert len({e.key for e in undone}) == 3
    s2_rows = [h for h in history.load(rig.client.engine.db, run.id) if h.step == "s2"]
    assert [(h.kind, h.attempt) for h in s2_rows if h.kind.startswith("reversal-")] == [
        ("reversal-lost", 1),
        ("reversal-completed", 2),
    ]


def test_on_a_sqlite_store_a_worker_killed_mid_reversal_finishes_the_unwind_once(
    tmp_path: Path,
) -> None:
    """SQLite's reversal claim (claim first, then read) under a real SIGKILL: worker
    processes share one SQLite file, as several processes of one host may; the killed
    worker's reversal is taken over once its lease lapses, and each step is undone once."""
    require_services(PORTS["postgres-rabbitmq"])
    store = f"sqlite:///{tmp_path}/crash.sqlite3"
    rig = CrashRig(BROKERS["postgres-rabbitmq"], tmp_path, store=store)
    try:
        test_worker_killed_mid_reversal_finishes_the_unwind_once_per_step(rig)
    finally:
        rig.close()


def test_worker_killed_mid_for_each_unwinds_each_iteration_once_with_its_own_item(
    rig: CrashRig,
) -> None:
    first = rig.start_worker()
    plan = {"pack:1": {"first_sleep": 6, "fail": True}}
    run = rig.client.engine.start("batch", {"order": 52, "items": ["a", "b", "c"], "plan": plan})

    rig.kill_and_restart_when(first, step_running(run, "pack:1"))
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    entries = rig.client.entries(run.id)
    forward = Counter(e.key for e in entries if e.direction == "forward")
    assert forward == {f"{run.id}:{name}:forward": 1 for name in ("open:0", "pack:0", "pack:1")}
    undone = [
        (e.step, e.detail.split(" result=")[0]) for e in entries if e.direction == "compensate"
    ]
    assert undone == [
        ("pack:1", "item='b' iteration=1"),
        ("pack:0", "item='a' iteration=0"),
        ("open", "{'step': 'open', 'attempt': 1}"),
    ]
    assert len({e.key for e in entries if e.direction == "compensate"}) == 3


def test_worker_killed_mid_child_step_is_recovered_through_the_parent(rig: CrashRig) -> None:
    first = rig.start_worker()
    run = rig.client.engine.start("parent", {"order": 53, "child_plan": {"c1": {"first_sleep": 6}}})

    def child_step_running() -> bool:
        steps = {s.name: s for s in run.get().steps}
        child_id = steps["child"].child_execution_id if "child" in steps else None
        try:  # the record names the child a moment before the child's row is written
            child = {s.name: s for s in rig.client.engine.get(child_id).steps} if child_id else {}
        except ExecutionNotFoundError:
            return False
        return "c1" in child and child["c1"].status.value == "running"

    rig.kill_and_restart_when(first, child_step_running)
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.COMPLETED
    child_id = execution.step("child").child_execution_id
    assert child_id is not None
    forward = Counter(e.key for e in rig.client.entries(child_id) if e.direction == "forward")
    assert forward == {f"{child_id}:c1:0:forward": 1, f"{child_id}:c2:0:forward": 1}


def test_a_wait_past_its_deadline_is_failed_by_the_beat_sweep(rig: CrashRig) -> None:
    rig.start_worker()
    run = rig.client.engine.start("approval", {"order": 54})
    execution = rig.drive_to_end(run.id, timeout=60)
    assert execution.state is ExecutionState.FAILED
    assert (execution.failure_reason or "").startswith("WaitTimeoutError")
    undone = [e.key for e in rig.client.entries(run.id) if e.direction == "compensate"]
    assert undone == [f"{run.id}:charge:0:compensate", f"{run.id}:reserve:0:compensate"]
