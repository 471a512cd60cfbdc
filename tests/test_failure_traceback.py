"""A step that raises fails its Celery task with the user's own traceback: the engine's
frames between the task and the user's code are left out, as Celery logs, signals and
stores it for a plain task."""

from __future__ import annotations

import uuid
from typing import Any

from celery import signals

from celery_saga import Saga
from celery_saga.records import ExecutionState
from tests.conftest import in_process_pg_engine


def _charge_card() -> None:
    _call_the_bank()


def _call_the_bank() -> None:
    raise ConnectionError("bank unreachable")


def test_a_failed_step_task_shows_the_users_traceback() -> None:
    saga = Saga(f"tb{uuid.uuid4().hex[:6]}")
    saga.step("reserve", lambda: None, compensate=lambda: None)
    saga.step("charge", _charge_card, retry=1)
    seen: list[tuple[list[str], str]] = []

    def on_failure(sender: Any = None, exception: Any = None, einfo: Any = None, **_: Any) -> None:
        if sender is not None and sender.name.endswith(".charge"):
            frames = []
            tb = exception.__traceback__
            while tb is not None:
                frame = tb.tb_frame
                frames.append(f"{frame.f_globals['__name__']}.{frame.f_code.co_name}")
                tb = tb.tb_next
            seen.append((frames, einfo.traceback))

    signals.task_failure.connect(on_failure, weak=False)
    try:
        with in_process_pg_engine("tb", saga) as engine:
            run = engine.start(saga.name, {}).wait(timeout=30)
    finally:
        signals.task_failure.disconnect(on_failure)
    assert run.state is ExecutionState.FAILED
    [(frames, text)] = seen
    user = frames.index(f"{__name__}._charge_card")
    assert frames[user:] == [f"{__name__}._charge_card", f"{__name__}._call_the_bank"]
    # above the user's code: Celery's tracer and the task's wrapper only, nothing of the
    # executor, the argument mapping or the timeout
    assert not [f for f in frames[:user] if f.startswith("celery_saga.runtime")], frames
    assert len(frames[:user]) <= 4, frames
    assert "_call_the_bank" in text and "ConnectionError: bank unreachable" in text
