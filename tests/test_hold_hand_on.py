"""Issue 42, guarantee 22's side: a process without a held run's version (a web process of
a newer release) checks that the run is held, then hands ``retry``, ``skip`` and ``unwind``
on to a worker that has the version, which carries them out; refused before sending
anything on a run that is not held, or (an unwind) past its pivot."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState, InvalidStateError, Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app

DOWN = {"now": True}


def _charge() -> str:
    if DOWN["now"]:
        raise ConnectionError("provider down")
    return "charged"


def _checkout(version: str, pivot: bool = False) -> Saga:
    saga = Saga("checkout", version=version).step("reserve", lambda: None, compensate=lambda: None)
    if pivot:
        saga = saga.pivot()
    return saga.step("charge", _charge, on_failure="hold", retry=1)


def _engines(tmp_path: Path, pivot: bool = False) -> tuple[SagaEngine, SagaEngine]:
    old_app, new_app = unconsumed_app("held-on"), unconsumed_app("held-on")
    new_app.conf.task_default_queue = old_app.conf.task_default_queue  # one queue, two deploys
    old_app.conf.broker_transport_options = {"polling_interval": 0.01}
    store = f"sqlite:///{tmp_path}/held_on.sqlite3"
    old, new = SagaEngine(old_app, store_url=store), SagaEngine(new_app, store_url=store)
    old.register(_checkout("1", pivot))
    new.register(_checkout("2", pivot).step("notify", lambda: None))
    return old, new


def _until(engine: SagaEngine, run_id: str, state: ExecutionState) -> Any:
    ends = time.monotonic() + 30
    while time.monotonic() < ends:
        execution = engine.get(run_id)
        if execution.state is state:
            return execution
        time.sleep(0.05)
    raise AssertionError(f"{run_id} is {engine.get(run_id).state}, not {state}")


@pytest.mark.parametrize("move", ["retry", "skip", "unwind"])
def test_a_move_from_a_process_without_the_version_is_carried_out_by_a_worker_with_it(
    tmp_path: Path, move: str
) -> None:
    old, new = _engines(tmp_path)
    DOWN["now"] = True
    with embedded_worker(old.app):
        run = old.start("checkout", {})
        _until(old, run.id, ExecutionState.HELD)
        DOWN["now"] = False
        if move == "retry":
            new.retry(run.id, actor="web:ops", reason="back")
            ended = _until(old, run.id, ExecutionState.COMPLETED)
            assert ended.step("charge").result == "charged"
        elif move == "skip":
            new.skip(run.id, result="by hand", actor="web:ops")
            ended = _until(old, run.id, ExecutionState.COMPLETED)
            assert ended.step("charge").result == "by hand"
        else:
            new.unwind(run.id, actor="web:ops")
            _until(old, run.id, ExecutionState.FAILED)
    assert old.get(run.id).record.definition_hash == old.definition("checkout").hash


def test_a_move_on_a_run_that_is_not_held_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    old, new = _engines(tmp_path, pivot=True)
    DOWN["now"] = False
    run = old.start("checkout", {})  # no worker: it stays running
    for call in (new.retry, new.unwind):
        with pytest.raises(InvalidStateError, match="to be held; it is running"):
            call(run.id)
    DOWN["now"] = True
    with embedded_worker(old.app):
        held = old.start("checkout", {})
        _until(old, held.id, ExecutionState.HELD)
        with pytest.raises(InvalidStateError, match="has passed its pivot"):
            new.unwind(held.id)
        assert old.get(held.id).state is ExecutionState.HELD
