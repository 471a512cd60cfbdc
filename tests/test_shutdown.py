"""A worker stopped by the SIGTERM its whole process group gets (``systemctl restart`` with
systemd's default ``KillMode=control-group``, a supervisor that signals the group) while a
step or a reversal runs (guarantee 27): the interrupted body is not the step's failure, its
claim is given up on the way out, and the next worker runs it again at once, once.

The lease here is the library's default (30 s) and the recovery sweep waits two minutes,
so a step running again within seconds can only come from the claim given up and the
message sent again, not from a lease running out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.store import history
from tests.conftest import BROKERS, PORTS, require_services
from tests.test_crash_recovery import (
    CrashRig,
    crash_rig,
    reversal_claimed,
    step_running,
    wait_for,
)

#: Seconds between a fresh worker answering ping and the interrupted body running again:
#: well under the 30 s lease a lost claim would wait for, with room for a loaded machine.
PICKUP = 15.0


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig(request.param, tmp_path, lease=30.0, recover_after=120.0)


def _sigterm_the_group_when(worker: subprocess.Popen[bytes], condition: Callable[[], bool]) -> None:
    wait_for(condition)
    time.sleep(0.5)  # well inside the body's sleep
    os.killpg(worker.pid, signal.SIGTERM)
    worker.wait(timeout=30)


def _worker_logs(rig: CrashRig) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(rig.tmp.glob("gen*/*.log")))


def test_sigterm_mid_step_is_no_failure_and_the_step_runs_again_at_once(rig: CrashRig) -> None:
    first = rig.start_worker()
    run = rig.client.engine.start("five", {"order": 70, "plan": {"s3": {"first_sleep": 8}}})

    _sigterm_the_group_when(first, step_running(run, "s3"))
    stopped = run.get()
    s3 = stopped.step("s3")
    assert stopped.state is ExecutionState.RUNNING, stopped.failure_reason
    assert (s3.status.value, s3.attempts, s3.error) == ("running", 1, None)
    assert s3.lease_expires_at is not None
    assert s3.lease_expires_at <= datetime.now(timezone.utc), "the claim was given up"
    logs = _worker_logs(rig)
    assert "step 's3' attempt 1 was interrupted by its worker's shutdown; not a failure" in logs
    assert "attempt 1 failed" not in logs

    rig.start_worker()
    wait_for(lambda: run.get().step("s3").attempts == 2, timeout=PICKUP)
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.COMPLETED
    assert execution.step("s3").attempts == 2
    entries = rig.client.entries(run.id)
    forward = Counter(e.key for e in entries if e.direction == "forward")
    assert forward == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
    assert [e.detail for e in entries if e.step == "s3"] == ["attempt=2"]
    s3_rows = [h for h in history.load(rig.client.engine.db, run.id) if h.step == "s3"]
    assert [(h.kind, h.attempt, h.detail) for h in s3_rows] == [
        ("step-released", 1, "its worker is shutting down"),
        ("step-completed", 2, None),
    ], "the released attempt is recorded once, not also as lost"


def test_sigterm_mid_reversal_is_no_failure_and_the_reversal_runs_again_at_once(
    rig: CrashRig,
) -> None:
    first = rig.start_worker()
    plan = {"s4": {"fail": True}, "s2": {"undo_first_sleep": 8}}
    run = rig.client.engine.start("five", {"order": 71, "plan": plan})

    _sigterm_the_group_when(first, reversal_claimed(run, "s2"))
    stopped = run.get()
    s2 = stopped.step("s2")
    assert stopped.state is ExecutionState.COMPENSATING
    assert (s2.compensation_status, s2.compensation_attempts, s2.compensation_reason) == (
        None,
        1,
        None,
    )
    assert "the reversal of step 's2' attempt 1 was interrupted" in _worker_logs(rig)

    rig.start_worker()
    wait_for(lambda: run.get().step("s2").compensation_attempts == 2, timeout=PICKUP)
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    undone = [e for e in rig.client.entries(run.id) if e.direction == "compensate"]
    assert [e.step for e in undone] == ["s3", "s2", "s1"]
    assert len({e.key for e in undone}) == 3
    s2_rows = [h for h in history.load(rig.client.engine.db, run.id) if h.step == "s2"]
    assert [(h.kind, h.attempt) for h in s2_rows if h.kind.startswith("reversal-")] == [
        ("reversal-released", 1),
        ("reversal-completed", 2),
    ], "the released reversal attempt is recorded once, not also as lost"


def test_on_a_sqlite_store_sigterm_mid_reversal_releases_it_and_it_runs_again_at_once(
    tmp_path: Path,
) -> None:
    """SQLite's reversal claim (claim first, then read) under a SIGTERM to the worker's
    process group: the claim is given up, not failed, and taken again at once."""
    require_services(PORTS["postgres-rabbitmq"])
    store = f"sqlite:///{tmp_path}/shutdown.sqlite3"
    rig = CrashRig(
        BROKERS["postgres-rabbitmq"], tmp_path, lease=30.0, recover_after=120.0, store=store
    )
    try:
        test_sigterm_mid_reversal_is_no_failure_and_the_reversal_runs_again_at_once(rig)
    finally:
        rig.close()


def test_a_warm_shutdown_lets_the_body_finish_and_record_its_outcome(rig: CrashRig) -> None:
    # ``celery control shutdown`` (and SIGTERM to the main process alone): the worker stops
    # taking messages and waits for the bodies in progress, whose outcomes are recorded.
    first = rig.start_worker()
    run = rig.client.engine.start("five", {"order": 72, "plan": {"s3": {"first_sleep": 4}}})

    wait_for(step_running(run, "s3"))
    # Only this rig's worker: other tests' workers share the broker's control exchange.
    names = [name for reply in rig.client.app.control.ping(timeout=1) for name in reply]
    ours = [name for name in names if rig.queue in name]
    assert len(ours) == 1, names
    rig.client.app.control.shutdown(destination=ours)
    first.wait(timeout=30)
    s3 = run.get().step("s3")
    assert (s3.status.value, s3.attempts, s3.error) == ("completed", 1, None)
    assert "interrupted by its worker's shutdown" not in _worker_logs(rig)

    rig.start_worker()
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.COMPLETED
    forward = Counter(e.key for e in rig.client.entries(run.id) if e.direction == "forward")
    assert forward == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
