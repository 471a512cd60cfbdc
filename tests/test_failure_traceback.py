"""A step that raises fails its Celery task with the user's own traceback: the engine's
frames between the task and the user's code are left out, as Celery logs, signals and
stores it for a plain task."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import signals

import celery_saga
from celery_saga import Saga
from celery_saga.records import ExecutionState
from tests.conftest import Harness, in_process_pg_engine


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
    # step runner, the ending, the executor, the argument mapping or the timeout
    engine_frames = [f for f in frames[:user] if f.startswith("celery_saga.")]
    assert engine_frames == ["celery_saga.worker.celery_hooks.run"], frames
    assert all(f.startswith("celery.") for f in frames[: user - 1]), frames
    assert "_call_the_bank" in text and "ConnectionError: bank unreachable" in text


def test_a_prefork_workers_log_shows_one_engine_frame_above_the_users_code(
    harness: Harness,
) -> None:
    """What a newcomer reads in a real worker's log: Celery's tracer, the wrapper, their
    code (docs/celery-tasks.md)."""
    if harness.in_process:
        pytest.skip("reads the log files of real prefork worker processes")
    run = harness.start("five", {"order": 43, "plan": {"s4": {"fail": True}}})
    assert run.wait(30).state is ExecutionState.FAILED, harness.worker_logs()
    time.sleep(0.5)  # the log line follows the stored outcome
    logs = "\n".join(p.read_text(errors="replace") for p in harness.logs)
    block = re.search(
        r"five\.s4\[[^\]]+\] raised unexpected: ValueError\('s4 refused order 43'\)\n"
        r"Traceback \(most recent call last\):\n(.*?)^ValueError: s4 refused order 43$",
        logs,
        re.MULTILINE | re.DOTALL,
    )
    assert block, logs[-3000:]
    files = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', block.group(1), re.MULTILINE)
    package = str(Path(celery_saga.__file__).parent)
    engine = [(Path(path).name, name) for path, name in files if path.startswith(package)]
    assert engine == [("celery_hooks.py", "run")], block.group(1)
    assert files[-1][1] == "forward" and files[-1][0].endswith("sagaapp.py"), files
