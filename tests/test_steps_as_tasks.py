"""A step is the user's own Celery task: options, hooks, signals, states and results work
as they do for a plain call of the task (one test per Celery feature a user relies on)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult

from celery_saga import DefinitionError, ExecutionState, Saga, SagaEngine
from tests.conftest import (
    BROKERS,
    PORTS,
    ROOT,
    Harness,
    _test_database_url,
    require_services,
    stop_workers,
)


def _rows(harness: Harness, run_id: str, direction: str | None = None) -> list[Any]:
    rows = harness.test_app.entries(run_id)
    return [r for r in rows if direction is None or r.direction == direction]


def _settle(harness: Harness, run_id: str, wanted: int, direction: str) -> list[Any]:
    """Hooks and signals are recorded after the outcome: wait for them."""
    deadline = time.monotonic() + 10
    while len(_rows(harness, run_id, direction)) < wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return _rows(harness, run_id, direction)


def test_base_class_hooks_see_every_attempt_and_reversal(harness: Harness) -> None:
    run = harness.start("feat_hooks", {"order": 7, "plan": {"hooked": {"fail_attempts": 1}}})
    assert run.wait(30).state is ExecutionState.FAILED
    # Every attempt that ran, and every reversal, gets its after_return: the attempt the
    # step's retry= runs again failed as a plain call would (it raised), so FAILURE.
    after = _settle(harness, run.id, 4, "after_return")
    statuses = sorted((r.step, r.detail) for r in after)
    assert statuses == [
        ("features.boom", "FAILURE"),
        ("features.hooked", "FAILURE"),
        ("features.hooked", "SUCCESS"),
        ("features.undo_hooked", "SUCCESS"),
    ]
    assert _rows(harness, run.id, "on_retry") == []
    # before_start comes before admission: a duplicate message (sent for every message on
    # the server backends) gets it too, and nothing after it.
    starts = {r.step for r in _rows(harness, run.id, "before_start")}
    assert starts == {"features.boom", "features.hooked", "features.undo_hooked"}
    failures = sorted((r.step, r.detail) for r in _rows(harness, run.id, "on_failure"))
    assert failures == [
        ("features.boom", "ValueError('warehouse refused order 7')"),
        ("features.hooked", "ValueError('card declined for order 7')"),
    ]
    successes = {r.step: r.detail for r in _rows(harness, run.id, "on_success")}
    # on_success sees the arguments the body was called with, mapped from the saga input.
    assert successes["features.hooked"] == "{'charged': 7} ['order', 'plan']"
    assert [r.step for r in _rows(harness, run.id, "compensate")] == ["features.undo_hooked"]


def test_signals_name_the_users_task_and_a_failed_attempt_is_a_failure(harness: Harness) -> None:
    run = harness.start("feat_hooks", {"order": 8, "plan": {"hooked": {"fail_attempts": 1}}})
    assert run.wait(30).state is ExecutionState.FAILED
    # Every failed attempt reaches task_failure, the one the saga then retried included.
    failures = _settle(harness, run.id, 2, "signal:task_failure")
    assert sorted((r.step, r.detail) for r in failures) == [
        ("features.boom", "['order']"),
        ("features.hooked", "['order', 'plan']"),
    ]
    assert _rows(harness, run.id, "signal:task_retry") == []  # only self.retry() is RETRY
    prerun = {r.step for r in _settle(harness, run.id, 4, "signal:task_prerun")}
    assert prerun == {"features.hooked", "features.boom", "features.undo_hooked"}
    successes = [r.step for r in _settle(harness, run.id, 2, "signal:task_success")]
    assert sorted(successes) == ["features.hooked", "features.undo_hooked"]


def test_bound_task_sees_its_real_message(harness: Harness) -> None:
    run = harness.start("feat_result", {"order": 9})
    assert run.wait(30).state is ExecutionState.COMPLETED
    (forward,) = _rows(harness, run.id, "forward")
    assert "called_directly=False" in forward.detail
    assert f"queue={harness.test_app.app.conf.task_default_queue}" in forward.detail
    assert uuid.UUID(forward.key)  # self.request.id is the message's id


def test_async_result_of_a_step_holds_its_recorded_result(harness: Harness) -> None:
    run = harness.start("feat_result", {"order": 10})
    assert run.wait(30).state is ExecutionState.COMPLETED
    (forward,) = _rows(harness, run.id, "forward")
    result = AsyncResult(forward.key, app=harness.test_app.app)
    assert result.get(timeout=10) == {"charged": 10} == run.get().step("hooked").result
    assert result.state == "SUCCESS"


def test_self_retry_is_a_saga_retry_under_the_same_task_id(harness: Harness) -> None:
    run = harness.start("feat_retry", {"failures": 2})
    assert run.wait(30).state is ExecutionState.COMPLETED
    rows = _rows(harness, run.id, "forward")
    assert [r.detail for r in rows] == ["retries=0", "retries=1", "retries=2"]
    assert len({r.key for r in rows}) == 1  # as with Celery's own retries
    assert run.get().step("retrying").attempts == 3
    assert AsyncResult(rows[0].key, app=harness.test_app.app).get(timeout=10) == 2


def test_self_retry_past_max_retries_fails_the_step(harness: Harness) -> None:
    run = harness.start("feat_retry", {"failures": 9})
    assert run.wait(30).state is ExecutionState.FAILED
    assert len(_rows(harness, run.id, "forward")) == 4  # max_retries=3: one run, three retries
    assert "ConnectionError: busy" in (run.get().failure_reason or "")


def test_autoretry_for_maps_onto_the_saga_retry(harness: Harness) -> None:
    done = harness.start("feat_autoretry", {"failures": 2})
    assert done.wait(30).state is ExecutionState.COMPLETED
    assert [r.detail for r in _rows(harness, done.id, "forward")] == [
        "retries=0",
        "retries=1",
        "retries=2",
    ]
    failed = harness.start("feat_autoretry", {"failures": 5})
    assert failed.wait(30).state is ExecutionState.FAILED
    assert len(_rows(harness, failed.id, "forward")) == 3  # max_retries=2
    assert "upstream reset the connection" in (failed.get().failure_reason or "")


def test_rate_limit_of_the_task_holds_for_its_steps(harness: Harness) -> None:
    runs = [harness.start("feat_rate") for _ in range(6)]
    for run in runs:
        assert run.wait(60).state is ExecutionState.COMPLETED
    starts = sorted(float(_rows(harness, run.id, "forward")[0].detail) for run in runs)
    workers = 1 if harness.in_process else 2  # the limit is per worker, as for a plain task
    assert starts[-1] - starts[0] >= 6 / workers - 1.5, starts


def test_priority_of_the_task_is_the_priority_of_its_step_messages(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("the memory transport carries no message priority")
    run = harness.start("feat_priority")
    assert run.wait(30).state is ExecutionState.COMPLETED
    assert [r.detail for r in _rows(harness, run.id, "forward")] == ["7"]


def test_plain_function_steps_are_tasks_named_after_saga_and_step(harness: Harness) -> None:
    app = harness.test_app.app
    assert "feat_plain.note" in app.tasks and "feat_plain.note.compensate" in app.tasks
    run = harness.start("feat_plain", {"order": 11})
    assert run.wait(30).state is ExecutionState.FAILED
    names = {r.step for r in _settle(harness, run.id, 3, "signal:task_prerun")}
    assert names == {"feat_plain.note", "features.boom", "feat_plain.note.compensate"}


def test_a_transform_is_a_task_that_succeeds_with_its_result(harness: Harness) -> None:
    run = harness.start("feat_map", {"amounts": [2, 3]})
    assert run.wait(30).state is ExecutionState.COMPLETED
    (success,) = _settle(harness, run.id, 1, "signal:task_success")
    assert success.step == "feat_map.total"  # not ignored: the transform ran in it
    assert AsyncResult(success.key, app=harness.test_app.app).get(timeout=10) == 5


def test_a_plain_call_of_a_step_task_is_unchanged(harness: Harness) -> None:
    task = harness.test_app.feature_tasks["features.hooked"]
    assert task(order=3) == {"charged": 3}  # called directly: the body, nothing else
    marker = f"plain-{uuid.uuid4().hex[:8]}"
    if harness.in_process:
        assert task.apply(kwargs={"order": 4, "marker": marker}).get() == {"charged": 4}
    else:
        result = task.apply_async(kwargs={"order": 4, "marker": marker})
        assert result.get(timeout=20) == {"charged": 4}
    assert [r.detail for r in _settle(harness, marker, 1, "after_return")] == ["SUCCESS"]


def test_two_retry_policies_on_one_step_are_refused_at_register() -> None:
    app = Celery("refusals", set_as_current=False)
    engine = SagaEngine(app, store_url="sqlite://")

    @app.task(name="shop.fetch", autoretry_for=(ConnectionError,), shared=False)
    def fetch() -> None: ...

    with pytest.raises(DefinitionError, match=r"retries itself .* and the step sets retry=3"):
        engine.register(Saga("twice").step(fetch, retry=3))
    assert engine.catalog("twice") is None


def test_a_task_of_another_app_is_refused_at_register() -> None:
    app, other = Celery("mine", set_as_current=False), Celery("theirs", set_as_current=False)
    engine = SagaEngine(app, store_url="sqlite://")

    @other.task(name="theirs.ship", shared=False)
    def ship() -> None: ...

    refused = r"'theirs\.ship' is not registered on the Celery app"
    with pytest.raises(DefinitionError, match=refused):
        engine.register(Saga("elsewhere").step(ship))


def test_a_worker_without_the_saga_refuses_its_step_instead_of_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    queue = f"saga-partial-{uuid.uuid4().hex[:10]}"
    ledger = tmp_path / "ledger"
    env = {
        "SAGA_TEST_BROKER": BROKERS["postgres-rabbitmq"],
        "SAGA_TEST_STORE": _test_database_url(),
        "SAGA_TEST_QUEUE": queue,
        "PARTIAL_LEDGER": str(ledger),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from tests import partial_app

    partial_app = importlib.reload(partial_app)  # the app of this test's queue and store
    engine = partial_app.engine
    engine.register(Saga("partial_order").step(partial_app.charge))  # here, not in the worker
    log = tmp_path / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "tests.partial_app:app", "worker"]
    command += ["-P", "prefork", "-c", "1", "-Q", queue, "-l", "INFO", "--without-mingle"]
    with log.open("wb") as output:
        worker = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        run = engine.start("partial_order", {"order": 5})
        deadline = time.monotonic() + 30
        while "not registered on this worker" not in log.read_text(errors="replace"):
            assert not ledger.exists(), "the body ran without admission"
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        assert not ledger.exists(), "the body ran without admission"
        assert run.get().state is ExecutionState.RUNNING  # left for a worker that knows it
    finally:
        stop_workers([worker])
