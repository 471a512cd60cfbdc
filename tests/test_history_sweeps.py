"""Guarantee 32 on PostgreSQL: no periodic query (recovery, timers, stats, the retention
claim) and no ``list`` filter reads the finished runs of the store's history. The history
benchmark fills a small store, plans each statement those calls send as the planner plans
them on a big one (no sequential scans), and counts the runs each plan reads."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event

from celery_saga.store import recovery
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


#: Parallel plans made free: the planner splits any read it can over workers.
_PARALLEL_FOR_FREE = (
    "SET LOCAL parallel_setup_cost = 0",
    "SET LOCAL parallel_tuple_cost = 0",
    "SET LOCAL min_parallel_table_scan_size = 0",
    "SET LOCAL min_parallel_index_scan_size = 0",
)


def _plan(pg_db: Any, sql: str, parameters: Any, settings: list[str]) -> str:
    with pg_db.engine.connect() as connection:
        transaction = connection.begin()
        for setting in [*_PARALLEL_FOR_FREE, *settings]:
            connection.exec_driver_sql(setting)
        cursor = connection.connection.driver_connection.cursor()
        cursor.execute("EXPLAIN " + sql, parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.rollback()
    return plan


def test_the_recovery_sweep_is_planned_without_parallel_workers(pg_db: Any) -> None:
    """At 3M finished runs the planner split the sweep's read of a few live runs over two
    workers: 11 ms to start them, for a read of 0.5 ms."""
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        sent.append((sql, parameters))

    event.listen(pg_db.engine, "before_cursor_execute", record)
    try:
        recovery.list_stale(pg_db, cutoff=datetime.now(UTC), limit=10)
    finally:
        event.remove(pg_db.engine, "before_cursor_execute", record)
    settings = [sql for sql, _ in sent if sql.startswith("SET LOCAL")]
    sql, parameters = next((s, p) for s, p in sent if s.lstrip().startswith("SELECT"))
    assert "Gather" in _plan(pg_db, sql, parameters, [])  # what the settings prevent
    assert "Gather" not in _plan(pg_db, sql, parameters, settings)
