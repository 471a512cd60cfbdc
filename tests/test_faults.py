"""Real outages and poison steps, with real worker processes (guarantees 20, 26, 27, 28).

The store (or the broker) is reached through a TCP proxy that a test, or a step's own body
at an exact moment, cuts for N seconds: live connections drop and new ones are refused.
The ledger (each body's effect, keyed by idempotency key) bypasses the proxy, so it shows
exactly what ran, and how often. Library defaults, except where a test shortens a time.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState, RollbackStatus, SagaError
from celery_saga.errors import StoreUnavailableError
from celery_saga.store import history
from celery_saga.store.history import ATTEMPT_KINDS, REVERSAL_KINDS
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

pytestmark = pytest.mark.services
TERMINAL = (ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.CANCELLED)


class FaultRig:
    """Two prefork workers (concurrency 2) and a beat, with the store or the client's
    broker behind a cuttable proxy."""

    def __init__(self, tmp: Path, *, cut: str = "postgres", **timing: str) -> None:
        require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
        self.tmp, self.queue = tmp, f"saga-fault-{uuid.uuid4().hex[:10]}"
        direct_store = _test_database_url()
        broker = BROKERS["postgres-rabbitmq"]
        self.proxy = CuttableProxy(5432 if cut == "postgres" else 5672)
        proxied = f"127.0.0.1:{self.proxy.port}"
        store = (
            direct_store.replace("127.0.0.1:5432", proxied) if cut == "postgres" else direct_store
        )
        client_broker = broker.replace("127.0.0.1:5672", proxied) if cut != "postgres" else broker
        self.env = {
            **os.environ,
            "SAGA_TEST_BROKER": broker,
            "SAGA_TEST_STORE": store,
            "SAGA_TEST_LEDGER": direct_store,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_DUPLICATE": "0",
            "SAGA_TEST_FAULT_CONTROL": str(self.proxy.control_port),
            "SAGA_TEST_LEASE": timing.get("lease", "30"),
            "SAGA_TEST_RECOVER_AFTER": timing.get("recover_after", "45"),
            "SAGA_TEST_SWEEP_INTERVAL": timing.get("sweep", "5"),
            "PYTHONPATH": str(Path.cwd()),
        }
        self.client = client_app(self.env, client_broker, store, self.queue)
        self.workers, _ = _spawn_workers(self.env, self.queue, tmp, count=2)
        _wait_ready(self.client, 2, self.workers)
        self.beat = spawn_beat(self.env, tmp)

    def wait_terminal(self, execution_id: str, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                execution = self.client.engine.get(execution_id)
            except StoreUnavailableError:
                continue
            if execution.state in TERMINAL:
                return execution
            time.sleep(0.25)
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in self.tmp.glob("*.log"))
        raise AssertionError(f"run {execution_id} did not end: {execution}\n{logs}")

    def ledger(self, execution_id: str, direction: str) -> Counter[str]:
        return Counter(e.key for e in self.client.entries(execution_id) if e.direction == direction)

    def close(self) -> None:
        stop_workers([*self.workers, self.beat])
        self.proxy.cut(0)
        self.proxy.wait_restored()
        with self.client.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(self.queue)
        self.proxy.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[FaultRig]:
    fault_rig = FaultRig(tmp_path)
    try:
        yield fault_rig
    finally:
        fault_rig.close()


@pytest.mark.parametrize("seconds", [1, 8])
def test_a_cut_during_a_reversal_outcome_write_neither_parks_nor_repeats_it(
    rig: FaultRig, seconds: int
) -> None:
    plan = {"s4": {"fail": True}, "s3": {"cut_after_undo": seconds}}
    run = rig.client.engine.start("five", {"order": 70, "plan": plan})
    execution = rig.wait_terminal(run.id)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = rig.ledger(run.id, "compensate")
    assert undone == {f"{run.id}:s{n}:0:compensate": 1 for n in (1, 2, 3)}
    assert rig.proxy.cuts, "the reversal's body did cut the store"
    # The first API call after the outage meets no connection the outage killed.
    assert rig.client.engine.get(run.id).state is ExecutionState.FAILED
    reversals = [
        (r.kind, r.step)
        for r in history.load(rig.client.engine.db, run.id)
        if r.kind in REVERSAL_KINDS
    ]
    assert reversals == [("reversal-completed", f"s{n}") for n in (3, 2, 1)], reversals


@pytest.mark.parametrize("seconds", [1, 30])
def test_a_cut_as_a_step_fails_records_the_failure_once_and_unwinds(
    rig: FaultRig, seconds: int
) -> None:
    plan = {"s4": {"fail_after_cut": seconds}}
    run = rig.client.engine.start("five", {"order": 72, "plan": plan})
    execution = rig.wait_terminal(run.id, timeout=180)
    assert execution.state is ExecutionState.FAILED
    assert execution.failure_reason == "ValueError: s4 refused order 72"
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert rig.ledger(run.id, "forward") == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 5)}
    undone = rig.ledger(run.id, "compensate")
    assert undone == {f"{run.id}:s{n}:0:compensate": 1 for n in (1, 2, 3)}
    assert rig.proxy.cuts, "the failing step did cut the store"
    assert _attempt_rows(rig, run.id) == [
        *(("step-completed", f"s{n}") for n in (1, 2, 3)),
        ("step-failed", "s4"),
    ], "the failure's history row is written once, with it"


def test_a_cut_during_a_step_outcome_write_runs_the_step_once(rig: FaultRig) -> None:
    run = rig.client.engine.start("five", {"order": 71, "plan": {"s2": {"cut_after": 8}}})
    execution = rig.wait_terminal(run.id)
    assert execution.state is ExecutionState.COMPLETED
    assert rig.ledger(run.id, "forward") == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
    completed = [("step-completed", f"s{n}") for n in range(1, 6)]
    assert _attempt_rows(rig, run.id) == completed, "each outcome's row is written once"


def _attempt_rows(rig: FaultRig, execution_id: str) -> list[tuple[str, str | None]]:
    rows = history.load(rig.client.engine.db, execution_id)
    return [(r.kind, r.step) for r in rows if r.kind in ATTEMPT_KINDS]


def test_public_api_raises_a_saga_error_past_its_budget_then_works_after_the_outage(
    rig: FaultRig,
) -> None:
    run = rig.client.engine.start("five", {"order": 72})
    rig.wait_terminal(run.id)
    engine = rig.client.engine
    default = engine.settings
    engine.settings = dataclasses.replace(default, store_retry_budget=1.0)
    rig.proxy.cut(4)
    with pytest.raises(StoreUnavailableError, match="could not be reached within 1 s"):
        engine.get(run.id)
    engine.settings = default
    # Within the default budget, a call made during the outage succeeds once it is over.
    assert engine.get(run.id).state is ExecutionState.COMPLETED


def test_a_step_body_longer_than_its_lease_runs_once(tmp_path: Path) -> None:
    rig = FaultRig(tmp_path, lease="10", recover_after="10", sweep="1")
    try:
        run = rig.client.engine.start("long", {"order": 73, "plan": {"marathon": {"sleep": 35}}})
        execution = rig.wait_terminal(run.id, timeout=90)
        assert execution.state is ExecutionState.COMPLETED
        assert rig.ledger(run.id, "forward") == {f"{run.id}:marathon:0:forward": 1}
        assert execution.step("marathon").attempts == 1, "never claimed again while it ran"
    finally:
        rig.close()


def test_a_timed_out_body_is_stopped_before_its_retry_and_before_any_reversal(
    rig: FaultRig,
) -> None:
    plan = {"slow": {"mark_begin": True, "sleep": 20}}
    run = rig.client.engine.start("timed", {"order": 74, "plan": plan})
    execution = rig.wait_terminal(run.id)
    assert execution.state is ExecutionState.FAILED
    assert "StepTimeoutError" in (execution.failure_reason or "")
    assert execution.rollback_status is RollbackStatus.COMPLETED
    began = [e for e in rig.client.entries(run.id) if e.direction == "forward_begin"]
    assert [e.detail for e in began] == ["attempt=1", "attempt=2"]
    time.sleep(22)  # past the end of a body that would have kept running
    finished = [
        e for e in rig.client.entries(run.id) if e.step == "slow" and e.direction == "forward"
    ]
    assert finished == [], "a timed-out body must be stopped, not abandoned"


@pytest.mark.parametrize("ending", [{"exit": 3}, {"unprintable": True}, {"hard_exit": 1}])
def test_a_step_that_cannot_settle_fails_after_its_attempts_and_unwinds(
    tmp_path: Path, ending: dict[str, Any]
) -> None:
    rig = FaultRig(tmp_path, lease="3", recover_after="3", sweep="1")
    try:
        run = rig.client.engine.start("exiting", {"order": 75, "plan": {"quit": ending}})
        execution = rig.wait_terminal(run.id, timeout=90)
        assert execution.state is ExecutionState.FAILED
        assert execution.rollback_status is RollbackStatus.COMPLETED
        quits = [
            e for e in rig.client.entries(run.id) if e.step == "quit" and e.direction == "forward"
        ]
        # An attempt that raises counts against retry=2; a lost worker's attempt counts
        # too, with one more allowed (retry + 1) so a single crash costs no run its step.
        expected = 3 if "hard_exit" in ending else 2
        assert len(quits) == expected, f"ran {len(quits)} times"
        assert rig.ledger(run.id, "compensate")[f"{run.id}:prep:0:compensate"] == 1
    finally:
        rig.close()


def test_start_during_a_broker_outage_stores_and_runs_one_business_process(
    tmp_path: Path,
) -> None:
    rig = FaultRig(tmp_path, cut="rabbitmq")
    try:
        execution_id = f"order-{uuid.uuid4().hex[:8]}"
        data = {"order": 76}
        rig.proxy.cut(6)
        handle = rig.client.engine.start("five", data, execution_id=execution_id)
        assert handle.id == execution_id
        again = rig.client.engine.start("five", data, execution_id=execution_id)
        assert again.id == execution_id
        with pytest.raises(SagaError, match="different saga or input"):
            rig.client.engine.start("five", {"order": 77}, execution_id=execution_id)
        execution = rig.wait_terminal(execution_id, timeout=60)
        assert execution.state is ExecutionState.COMPLETED
        assert rig.ledger(execution_id, "forward")[f"{execution_id}:s1:0:forward"] == 1
    finally:
        rig.close()


def test_a_reversal_whose_worker_keeps_dying_parks_the_run_after_its_attempts(
    tmp_path: Path,
) -> None:
    rig = FaultRig(tmp_path, lease="3", recover_after="3", sweep="1")
    try:
        plan = {"quit": {"fail": True}, "prep": {"undo_hard_exit": 1}}
        run = rig.client.engine.start("exiting", {"order": 78, "plan": plan})
        deadline = time.monotonic() + 120
        while run.get().state is not ExecutionState.COMPENSATION_STUCK:
            assert time.monotonic() < deadline, run.get()
            time.sleep(0.5)
        execution = run.get()
        # compensation_retry=3: three attempts that may fail, and one more for a lost worker.
        assert rig.ledger(run.id, "compensate")[f"{run.id}:prep:0:compensate"] == 4
        assert "WorkerLostError" in (execution.step("prep").compensation_reason or "")
    finally:
        rig.close()
