"""Guarantee 32 on PostgreSQL: no periodic query (recovery, timers, stats, the retention
claim) and no ``list`` filter reads the finished runs of the store's history. The history
benchmark fills a small store, plans each statement those calls send as the planner plans
them on a big one (no sequential scans), and counts the runs each plan reads."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import PG_ADMIN, PORTS, ROOT, require_services

#: 10,000 finished runs (2,000 failed) against 125 unfinished ones and a batch of 500: a
#: plan that reads the failed or completed runs reads more than the check allows.
SMALL = ["--runs", "10000", "--waiting", "100", "--live", "20", "--parked", "5"]


def _history(*extra: str) -> subprocess.CompletedProcess[str]:
    require_services(PORTS["postgres"])
    command = [sys.executable, "benchmarks/history.py", *SMALL, "--repeats", "1", "--check"]
    return subprocess.run(
        [*command, *extra],
        cwd=ROOT,
        env={**os.environ, "BENCH_ADMIN_URL": PG_ADMIN},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sweeps_and_list_filters_read_only_unfinished_runs_and_retention_drains() -> None:
    done = _history("--retire-runs", "1000")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    for label in ("recover()", "fire_timers()", "stats", "retention claim"):
        assert f"\n-- {label}: " in done.stdout
    assert "list(rollback_status=stuck)" in done.stdout
    assert "archived 1000 runs" in done.stdout and "deleted 1000 runs" in done.stdout


def test_the_check_fails_when_the_recovery_sweep_loses_its_index() -> None:
    done = _history("--retire-runs", "0", "--without-index", "ix_saga_executions_unwind_owed")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr
    assert "READS HISTORY: recover() reads" in done.stdout
