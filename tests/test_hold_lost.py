"""A hold step whose LAST attempt is lost with its worker (issue 42's drill): the run holds,
it does not unwind, and a retry completes it with the step's effect once.

Real prefork workers and a real ``celery beat`` (its recovery sweep brings a lost attempt
back). The first attempt loses its pool process (SIGKILL of the child: the worker lives
on); the second and last loses its whole worker (SIGKILL of its process group). With
``retry=1`` a lost attempt gets one more (guarantee 27), so the second is the last.
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState
from celery_saga.records import StepStatus
from celery_saga.store import history
from tests.test_crash_recovery import CrashRig, crash_rig, wait_for


@pytest.fixture(params=["postgres-rabbitmq", "postgres-redis"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig(request.param, tmp_path)


def _attempt_running(rig: CrashRig, run_id: str, attempt: int) -> Callable[[], bool]:
    """Whether ``attempt`` of ``charge`` has reached its body (its ledger row is written)."""

    def running() -> bool:
        return any(
            e.direction == "forward" and e.detail.startswith(f"attempt={attempt} ")
            for e in rig.client.entries(run_id)
        )

    return running


def _pid_of(rig: CrashRig, run_id: str, attempt: int) -> int:
    for entry in rig.client.entries(run_id):
        found = re.fullmatch(rf"attempt={attempt} pid=(\d+)", entry.detail or "")
        if entry.direction == "forward" and found:
            return int(found.group(1))
    raise AssertionError(f"attempt {attempt} never reached its body")


def _state_is(rig: CrashRig, run_id: str, state: ExecutionState) -> Callable[[], bool]:
    return lambda: rig.client.engine.get(run_id).state is state


def test_a_hold_step_losing_its_last_attempt_holds_the_run_and_a_retry_completes_it_once(
    rig: CrashRig,
) -> None:
    worker = rig.start_worker()
    hang = f"hang-{uuid.uuid4().hex}"
    rig.client.set_switch(hang, True)
    engine = rig.client.engine
    run = engine.start("held_hanging", {"order": 7, "hang": hang})

    wait_for(_attempt_running(rig, run.id, 1))
    os.kill(_pid_of(rig, run.id, 1), signal.SIGKILL)  # the pool child only
    wait_for(_attempt_running(rig, run.id, 2), timeout=60)
    rig.kill(worker)  # the whole worker, on the last attempt
    rig.start_worker()
    wait_for(_state_is(rig, run.id, ExecutionState.HELD), timeout=60)

    held = engine.get(run.id)
    charge = held.step("charge")
    # The failure is recorded under the claim that found no attempt left (guarantee 27).
    assert charge.status is StepStatus.FAILED and charge.attempts == 3
    assert held.failure_reason.startswith("WorkerLostError: attempt 2 of step 'charge'")
    assert held.rollback_status is None, "a lost last attempt does not start an unwind"
    entries = rig.client.entries(run.id)
    assert not [e for e in entries if e.direction in ("compensate", "effect")]
    charges = [e for e in entries if e.direction == "forward" and e.step == "charge"]
    assert len(charges) == 2, "no third body ran"
    kinds = [(r.kind, r.step, r.attempt) for r in history.load(engine.db, run.id)]
    assert ("step-lost", "charge", 1) in kinds and ("step-lost", "charge", 2) in kinds
    assert kinds[-1][0] == "held"

    rig.client.set_switch(hang, False)
    engine.retry(run.id, actor="ops@example", reason="provider answers again")
    done = rig.drive_to_end(run.id)
    assert done.state is ExecutionState.COMPLETED
    entries = rig.client.entries(run.id)
    effects = Counter(e.key for e in entries if e.direction == "effect")
    assert effects == {charge.idempotency_key: 1}, "charged exactly once, under its one key"
    assert not [e for e in entries if e.direction == "compensate"]
    assert done.step("charge").idempotency_key == charge.idempotency_key
    retried: list[Any] = [r for r in history.load(engine.db, run.id) if r.kind == "hold-retried"]
    assert [(r.actor, r.detail) for r in retried] == [("ops@example", "provider answers again")]
