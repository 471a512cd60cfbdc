"""``python -m example_project`` reads as a demo: six timelines, each intentional failure
one line under its timeline, and a traceback only for an error nobody planned."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from example_project.failures import FailureLog, ShippingRefused

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_project_runs_its_six_timelines_without_a_traceback(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "example_project"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Traceback" not in out + done.stderr
    assert done.stderr == "", done.stderr[-3000:]
    headings = [line.split("  [")[0] for line in out.splitlines() if line.startswith("== ")]
    assert [h.split(".")[0] for h in headings] == [
        "== 1",
        "== 2",
        "== 3a",
        "== 3b",
        "== 4",
        "== 5",
        "== 6",
    ]
    assert out.count("state=completed") == 2
    # Each step is its own Celery task: Celery's signals name it, with its true outcome.
    assert "7 task_failure (book_courier x2, release_item x1, ship_order x4)" in out
    assert out.count("state=failed  rollback=completed") == 3
    assert "state=compensation_stuck  rollback=stuck" in out
    assert "WaitTimeoutError: saga 'order' waited 2 s" in out
    assert "signal     'approved' received" in out
    assert "  | compensated capture" in out, "the nested payment saga was unwound"
    assert "state=cancelled  rollback=completed" in out
    assert "failure_reason: CancelledError: the customer withdrew order E5" in out
    # Shipping is tried twice: the first failure is a retry line, the last its outcome.
    retry = "retry      ship_order  (attempt 1: ShippingRefused: carrier rejected order B2)"
    assert out.count(retry) == 1
    assert out.count("failed     ship_order  (ShippingRefused: carrier rejected order B2)") == 1
    # The courier's outage holds the booking; the operator's retry completes it.
    assert "held       for an operator: the courier's API is down" in out
    assert "retried    by the operator" in out


def _record(error: BaseException, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(
        "celery_saga",
        level,
        __file__,
        1,
        "saga %r execution %s: step %r attempt %d failed: %s",
        ("order", "run-1", "ship_order", 1, f"{type(error).__name__}: {error}"),
        (type(error), error, None),
    )


def test_an_unexpected_error_keeps_its_log_record_and_traceback() -> None:
    failures = FailureLog()
    assert failures.filter(_record(KeyError("surprise"))) is True
    assert failures.lines == {}


def test_an_intentional_failure_becomes_one_timeline_line_or_none() -> None:
    failures = FailureLog()
    assert failures.filter(_record(ShippingRefused("carrier down"))) is False
    assert failures.filter(_record(ShippingRefused("carrier down"), logging.ERROR)) is False
    [(_, line)] = failures.lines["run-1"]
    assert line == "retry      ship_order  (attempt 1: ShippingRefused: carrier down)"
