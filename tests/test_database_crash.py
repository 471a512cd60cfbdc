"""A database server crash costs no body twice (guarantee 30): claims the store lost are
written back by their live holders, and the sweep leaves them to those holders.

The store is a PostgreSQL cluster of the test's own, stopped with ``-m immediate`` (a host
crash, the OOM killer: no checkpoint; commits not yet flushed to the WAL are lost) 20 ms
after the bodies begin, at the moments that matter: just after the claims, during the
outcomes (and the next step's claims), during the reversals' claims. One prefork worker of
4 slots and a real beat, on RabbitMQ, with the library's defaults. The ledger, on the shared
server, is never crashed: it counts each body's beginnings.
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

from celery_saga import ExecutionState, RollbackStatus
from tests import pg_cluster
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

pytestmark = pytest.mark.services

#: The library's defaults (``docs/settings.md``).
DEFAULTS = {"lease": "30", "recover_after": "45", "sweep": "15"}
BODY = 4.0
RUNS = 4
TERMINAL = (ExecutionState.COMPLETED, ExecutionState.FAILED)


class DatabaseCrashRig:
    def __init__(self, tmp: Path, **timing: str) -> None:
        require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
        reason = pg_cluster.available()
        if reason is not None:
            pytest.fail(f"a test cluster cannot be made here: {reason}")
        self.tmp, self.queue = tmp, f"saga-dbcrash-{uuid.uuid4().hex[:10]}"
        self.cluster = pg_cluster.OwnCluster()
        timing = {**DEFAULTS, **timing}
        self.recover_after = float(timing["recover_after"])
        self.env = {
            **os.environ,
            "SAGA_TEST_BROKER": BROKERS["postgres-rabbitmq"],
            "SAGA_TEST_STORE": self.cluster.url(),
            "SAGA_TEST_LEDGER": _test_database_url(),
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_DUPLICATE": "0",
            "SAGA_TEST_LEASE": timing["lease"],
            "SAGA_TEST_RECOVER_AFTER": timing["recover_after"],
            "SAGA_TEST_SWEEP_INTERVAL": timing["sweep"],
            "PYTHONPATH": str(Path.cwd()),
        }
        broker = BROKERS["postgres-rabbitmq"]
        self.client = client_app(self.env, broker, self.cluster.url(), self.queue)
        self.client.engine.ensure_schema()
        self.workers: list[subprocess.Popen[bytes]] = []
        self.generation = 0
        self.start_worker()
        self.beat = spawn_beat(self.env, tmp)

    def start_worker(self) -> subprocess.Popen[bytes]:
        self.generation += 1
        logdir = self.tmp / f"gen{self.generation}"
        logdir.mkdir()
        workers, _ = _spawn_workers(self.env, self.queue, logdir, count=1, concurrency=RUNS)
        self.workers.extend(workers)
        _wait_ready(self.client, 1, workers)
        return workers[0]

    def start_runs(self, saga: str, plan: dict[str, Any]) -> list[str]:
        return [self.client.engine.start(saga, {"plan": plan}).id for _ in range(RUNS)]

    def marks(self, runs: list[str], direction: str) -> Counter[tuple[str, str]]:
        """(run, step) -> how many bodies (``direction`` of the ledger) began."""
        return Counter(
            (entry.execution_id, entry.step)
            for run in runs
            for entry in self.client.entries(run)
            if entry.direction == direction
        )

    def crash_when(self, condition: Callable[[], bool], down: float = 1.0) -> float:
        """Crash the server 20 ms after ``condition`` holds; returns when it was back."""
        wait_for(condition, timeout=60)
        time.sleep(0.02)
        return self.cluster.restart_after(down)

    def settle(self, runs: list[str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        ended: dict[str, Any] = {}
        while time.monotonic() < deadline and len(ended) < len(runs):
            for run in runs:
                if run in ended:
                    continue
                try:
                    execution = self.client.engine.get(run)
                except Exception:
                    continue  # the store is starting
                if execution.state in TERMINAL:
                    ended[run] = execution
            time.sleep(0.2)
        return ended

    def logs(self) -> str:
        parts = sorted(self.tmp.glob("gen*/worker*.log"))
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in parts)

    def close(self) -> None:
        stop_workers([*self.workers, self.beat])
        try:
            with self.client.app.connection_for_write() as connection:
                connection.default_channel.queue_delete(self.queue)
        finally:
            self.client.engine.db.dispose()
            self.cluster.close()


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("the condition did not hold in time")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DatabaseCrashRig]:
    rig = DatabaseCrashRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def begun(rig: DatabaseCrashRig, runs: list[str], direction: str, count: int) -> Callable[[], bool]:
    return lambda: sum(rig.marks(runs, direction).values()) >= count


def settle_round(
    rig: DatabaseCrashRig, runs: list[str], back: float, direction: str, state: ExecutionState
) -> tuple[dict[tuple[str, str], int], float]:
    """Wait for the round's runs; (bodies begun other than once, seconds to settle)."""
    ended = rig.settle(runs, timeout=rig.recover_after + 30)
    settled_in = time.monotonic() - back
    assert len(ended) == len(runs), f"runs not settled: {set(runs) - set(ended)}\n{rig.logs()}"
    assert {e.state for e in ended.values()} == {state}, ended
    twice = {k: n for k, n in rig.marks(runs, direction).items() if n != 1}
    return twice, settled_in


def three_rounds(
    rig: DatabaseCrashRig, saga: str, plan: dict[str, Any], crash_after: str, counted: str
) -> list[str]:
    """Three rounds of RUNS runs, the server crashed 20 ms after RUNS ``crash_after`` marks;
    asserts every body (``counted`` marks) began once and every run settled within
    ``recover_after`` of the restart. Returns all the runs."""
    state = ExecutionState.FAILED if crash_after == "compensate_begin" else ExecutionState.COMPLETED
    every, twice, slowest = [], {}, 0.0
    for _ in range(3):
        runs = rig.start_runs(saga, plan)
        back = rig.crash_when(begun(rig, runs, crash_after, RUNS))
        doubled, settled_in = settle_round(rig, runs, back, counted, state)
        every += runs
        twice.update(doubled)
        slowest = max(slowest, settled_in)
    print(f"{saga}: {len(twice)} of {3 * RUNS} runs ran a body twice; slowest {slowest:.1f} s")
    assert not twice, f"bodies run other than once: {twice}\n{rig.logs()}"
    assert slowest <= rig.recover_after, slowest
    return every


def test_claims_lost_in_a_crash_just_after_the_bodies_begin_are_rewritten_by_their_holders(
    rig: DatabaseCrashRig,
) -> None:
    plan = {"marathon": {"mark_begin": True, "sleep": BODY}}
    three_rounds(rig, "long", plan, "forward_begin", "forward_begin")


def test_a_crash_during_the_outcomes_and_the_next_claims_runs_no_body_twice(
    rig: DatabaseCrashRig,
) -> None:
    # The first bodies' effects are written a moment before their outcomes, and the
    # outcomes a moment before the second steps' claims.
    plan = {name: {"mark_begin": True, "sleep": BODY} for name in ("a", "b")}
    three_rounds(rig, "failed_eligible", plan, "forward", "forward_begin")


def test_reversal_claims_lost_in_a_crash_are_rewritten_by_their_holders(
    rig: DatabaseCrashRig,
) -> None:
    undo = BODY - 1  # within the test app's reversal timeout (4 s)
    plan = {
        "a": {"undo_mark_begin": True, "undo_sleep": undo},
        "b": {"fail": True, "undo_mark_begin": True, "undo_sleep": undo},
    }
    runs = three_rounds(rig, "failed_eligible", plan, "compensate_begin", "compensate_begin")
    rollbacks = {rig.client.engine.get(r).rollback_status for r in runs}
    assert rollbacks == {RollbackStatus.COMPLETED}


def test_a_holder_killed_while_the_server_is_down_runs_its_body_again_once(
    tmp_path: Path,
) -> None:
    """With its holder gone, a lost claim has nobody to write it back: the body runs again
    (at-least-once, as documented) once the store has been up for ``recover_after``, and
    only once. Shorter times than the defaults, so that the recovery is quick."""
    rig = DatabaseCrashRig(tmp_path, lease="6", recover_after="10", sweep="2")
    try:
        runs = rig.start_runs("long", {"marathon": {"mark_begin": True, "sleep": BODY}})
        wait_for(begun(rig, runs, "forward_begin", RUNS), timeout=60)
        time.sleep(0.02)
        rig.cluster.crash()
        worker = rig.workers[-1]
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        rig.cluster.start()
        rig.start_worker()
        ended = rig.settle(runs, timeout=90)
        assert len(ended) == len(runs), f"not settled: {set(runs) - set(ended)}\n{rig.logs()}"
        assert {e.state for e in ended.values()} == {ExecutionState.COMPLETED}
        marks = rig.marks(runs, "forward_begin")
        print(f"bodies re-run after their holder died: {sum(marks.values()) - RUNS} of {RUNS}")
        assert sorted(marks.values()) == [2] * RUNS, marks
    finally:
        rig.close()
