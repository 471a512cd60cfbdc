"""Guarantee 22, the caller's side: a process without a run's version (a web process
deployed with newer code) checks what it can, then hands ``signal``, ``resume_compensation``
and ``cancel`` on as one ``celery_saga.command`` message naming the run's version, instead
of refusing. The worker's side, with real workers, is in tests/test_rolling_deploy.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_saga import InvalidStateError, Saga, SagaEngine, SagaError
from celery_saga.worker.saga_header import HEADER
from tests.conftest import unconsumed_app


def _approve(version: str) -> Saga:
    saga = Saga("approve", version=version).step("hold", lambda: None).wait_for("ok")
    return saga.step("done", lambda: None)


def _engines(tmp_path: Path) -> tuple[SagaEngine, SagaEngine]:
    old_app, new_app = unconsumed_app("hand-on"), unconsumed_app("hand-on")
    new_app.conf.task_default_queue = old_app.conf.task_default_queue  # one queue, two deploys
    store = f"sqlite:///{tmp_path}/hand_on.sqlite3"
    old, new = SagaEngine(old_app, store_url=store), SagaEngine(new_app, store_url=store)
    old.register(_approve("1"))
    new.register(_approve("2").step("notify", lambda: None))
    return old, new


def _sent(engine: SagaEngine) -> list[Any]:
    """The messages waiting on the app's queue, taken off it."""
    queue = engine.app.conf.task_default_queue
    with engine.app.connection_for_write() as connection:
        simple = connection.SimpleQueue(queue)
        messages = []
        while simple.qsize():
            message = simple.get(timeout=1)
            messages.append(message)
            message.ack()
        simple.close()
    return messages


def test_a_signal_from_a_process_without_the_version_is_handed_on(tmp_path: Path) -> None:
    old, new = _engines(tmp_path)
    run = old.start("approve", {})
    _sent(old)
    with pytest.raises(SagaError, match="payload of signal 'ok'"):
        new.signal(run.id, "ok", object())
    assert _sent(new) == [], "bad input sends nothing"

    assert new.signal(run.id, "ok", {"by": "web"}) is False
    (message,) = _sent(new)
    assert message.headers["task"] == "celery_saga.command"
    assert message.headers[HEADER] == {
        "id": run.id,
        "saga": "approve",
        "v": old.definition("approve").hash,
        "store": new.hand_backs.store,  # the store the run lives in
    }
    execution_id, command, arguments = message.decode()[0]
    assert (execution_id, command, arguments["event"]) == (run.id, "signal", "ok")
    assert "web" not in message.headers["argsrepr"], "the payload stays out of the logs"
    assert new.get(run.id).record == old.get(run.id).record


def test_a_resume_from_a_process_without_the_version_is_checked_before_it_is_handed_on(
    tmp_path: Path,
) -> None:
    old, new = _engines(tmp_path)
    run = old.start("approve", {})
    _sent(old)
    with pytest.raises(InvalidStateError, match="resume_compensation"):
        new.resume_compensation(run.id)
    assert _sent(new) == [], "a run that is not parked: refused here, nothing sent"


def test_a_cancel_from_a_process_without_the_version_is_stored_then_handed_on(
    tmp_path: Path,
) -> None:
    old, new = _engines(tmp_path)
    run = old.start("approve", {})
    _sent(old)
    new.cancel(run.id, "customer asked")
    assert new.get(run.id).state.value == "cancelling"
    (message,) = _sent(new)
    assert message.decode()[0][:2] == [run.id, "cancel"]


def test_in_eager_mode_there_is_no_worker_to_hand_on_to(tmp_path: Path) -> None:
    old, new = _engines(tmp_path)
    run = old.start("approve", {})
    new.app.conf.task_always_eager = True
    with pytest.raises(SagaError, match="not registered in this process"):
        new.signal(run.id, "ok")
