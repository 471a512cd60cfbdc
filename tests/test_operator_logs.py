"""Logs and monitors tell the truth without noise: a failed step logs as failed, a retried
one as a retry, sweeps that find nothing stay at DEBUG and out of Flower, and migrations
log only when they run."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS, info

from celery_saga import ExecutionState
from celery_saga.worker.housekeeping import quiet_housekeeping_logs
from celery_saga.worker.publisher import FIRE_TIMERS_TASK, RECOVER_TASK
from tests.conftest import ROOT, Harness


def _full_logs(harness: Harness) -> str:
    return "\n".join(p.read_text(errors="replace") for p in harness.logs)


def test_a_failed_step_logs_failed_and_a_retried_one_retry(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("reads the log files of real worker processes")
    plan = {"s3": {"fail_attempts": 1}, "s4": {"fail": True}}
    run = harness.start("five", {"order": 41, "plan": plan})
    assert run.wait(30).state is ExecutionState.FAILED, harness.worker_logs()
    time.sleep(0.5)  # the log line follows the stored outcome
    logs = _full_logs(harness)
    # The step is its own task: Celery logs its failure as for a plain call, with its error.
    failed = re.search(
        r"five\.s4\[([^\]]+)\] raised unexpected: ValueError\('s4 refused order 41'\)", logs
    )
    assert failed, logs[-3000:]
    assert f"five.s4[{failed.group(1)}] succeeded" not in logs
    # One traceback per failed attempt, Celery's: the engine's own line says what it decided.
    attempts = re.findall(
        r"five\.s4\[[^\]]+\] raised unexpected: ValueError\('s4 refused order 41'\)", logs
    )
    tracebacks = re.findall(r"^ValueError: s4 refused order 41$", logs, re.MULTILINE)
    assert len(tracebacks) == len(attempts), logs[-3000:]
    # The attempt that retry= runs again failed as a plain call would, and the engine says
    # it will be retried.
    retried = re.search(r"five\.s3\[[^\]]+\] raised unexpected: ValueError", logs)
    assert retried, logs[-3000:]
    assert re.search(r"WARNING.*step 's3' attempt 1 failed: ValueError", logs), logs[-3000:]


def test_the_store_does_not_announce_itself_at_every_worker_start(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("reads the log files of real worker processes")
    logs = _full_logs(harness)
    assert "alembic" not in logs.lower() and "Context impl" not in logs
    # The test process migrated the store first: the workers found nothing to do.
    assert "saga store schema migrated" not in logs
    assert f"{RECOVER_TASK}[" not in logs, "an idle start-up sweep logs nothing at INFO"


def test_idle_sweeps_log_at_debug_and_busy_ones_at_info(caplog: pytest.LogCaptureFixture) -> None:
    quiet_housekeeping_logs()
    caplog.set_level(logging.INFO)
    received = {"name": FIRE_TIMERS_TASK, "id": "t1", "args": "", "kwargs": "", "eta": None}
    logging.getLogger("celery.worker.strategy").info(LOG_RECEIVED, received)
    idle = {"name": FIRE_TIMERS_TASK, "id": "t1", "runtime": 0.01, "return_value": "0"}
    info(LOG_SUCCESS, idle)
    assert not caplog.records
    info(LOG_SUCCESS, {**idle, "return_value": "2"})
    info(LOG_SUCCESS, {**idle, "name": "shop.charge"})
    assert [r.getMessage().split("]")[0] for r in caplog.records] == [
        f"Task {FIRE_TIMERS_TASK}[t1",
        "Task shop.charge[t1",
    ]
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    info(LOG_SUCCESS, idle)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_sweeps_send_no_task_events_while_steps_do(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("the embedded worker sends no events over the memory transport")
    app = harness.test_app.app
    captured: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": captured.append})
        thread = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": None, "wakeup": False}
        )
        thread.daemon = True
        thread.start()
        time.sleep(1.0)
        sweep = app.send_task(RECOVER_TASK)
        run = harness.start("five", {"order": 42})
        assert run.wait(30).state is ExecutionState.COMPLETED
        time.sleep(2.0)
        receiver.should_stop = True
    ids = {e.get("uuid") for e in captured if e["type"].startswith("task-")}
    names = {e.get("name") for e in captured if e["type"] == "task-received"}
    assert "sagaapp.s1" in names, names
    assert sweep.id not in ids


def test_a_migration_logs_one_line_only_when_it_changes_the_schema(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_saga.store import schema
    from celery_saga.store.database import Database

    caplog.set_level(logging.DEBUG)
    url = f"sqlite:///{tmp_path}/fresh.sqlite3"
    first = Database(url)
    first.migrate()
    head = schema.head_revision()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert lines == [f"saga store schema migrated from empty to {head}"]
    caplog.clear()
    second = Database(url)  # another worker starting on the same store
    second.migrate()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    schema.move(second, "0001", down=True)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        f"saga store schema migrated from {head} to 0001"
    ]
    assert schema.current_revision(second) == "0001"
    first.dispose()
    second.dispose()


_BEAT_APP = """
import os
from celery import Celery
from celery_saga import SagaEngine
folder = os.environ["TEST_FOLDER"]
app = Celery("quiet_beat", broker="filesystem://", set_as_current=False)
app.conf.update(
    broker_transport_options={"data_folder_in": folder, "data_folder_out": folder},
    saga_store_url=f"sqlite:///{folder}/store.sqlite3",
    saga_timer_interval=0.5,
    saga_recover_interval=1,
    saga_cleanup_after=3600,
    saga_cleanup_interval=1,
    beat_schedule={"nightly-report": {"task": "shop.report", "schedule": 1.0}},
)
engine = SagaEngine(app)
"""


def _beat_lines(tmp_path: Path, level: str, seconds: float) -> list[str]:
    """What a real ``celery beat`` of an app with the engine's entries (on short intervals)
    and one entry of the app's own logs at ``level`` in ``seconds``."""
    folder = tmp_path / level
    folder.mkdir()
    (folder / "quiet_beat.py").write_text(_BEAT_APP)
    env = {**os.environ, "PYTHONPATH": f"{folder}:{ROOT}", "TEST_FOLDER": str(folder)}
    command = [sys.executable, "-m", "celery", "-A", "quiet_beat", "beat", "-l", level]
    command += ["-s", str(folder / "schedule"), "--max-interval", "1"]
    with open(folder / "beat.log", "wb") as log:
        beat = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        time.sleep(seconds)
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(timeout=30)
    return (folder / "beat.log").read_text(errors="replace").splitlines()


def test_beat_sends_the_engines_entries_without_a_line_each_at_info(tmp_path: Path) -> None:
    """The engine's entries come every few seconds and say nothing when nothing is due (the
    worker's line says when a sweep acted): beat's "Sending due task" line for them is at
    DEBUG; an entry of the app's own keeps its INFO line."""
    said = _beat_lines(tmp_path, "INFO", 6)
    sending = [line for line in said if "Sending due task" in line]
    assert any("nightly-report (shop.report)" in line for line in sending), said
    assert not [line for line in sending if "celery_saga." in line], sending
    shown = _beat_lines(tmp_path, "DEBUG", 4)
    engines = [line for line in shown if "Sending due task celery-saga-" in line]
    assert {line.split("Sending due task ")[1] for line in engines} == {
        "celery-saga-fire-timers (celery_saga.fire_timers)",
        "celery-saga-recover (celery_saga.recover)",
        "celery-saga-cleanup (celery_saga.cleanup)",
    }, shown
    assert all("DEBUG/" in line for line in engines), engines
