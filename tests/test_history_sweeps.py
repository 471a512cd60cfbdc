"""Guarantee 32 on PostgreSQL: no periodic query (recovery, timers, stats, the retention
claim) and no ``list`` filter reads the finished runs of the store's history. The history
benchmark fills a small store, plans each statement those calls send as the planner plans
them on a big one (no sequential scans), and counts the runs each plan reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, event, insert

from celery_saga.store import recovery, retention
from celery_saga.store.database import Database, to_db_time
from celery_saga.store.tables import executions
from tests.conftest import PG_ADMIN, PORTS, ROOT, mariadb_url, require_services

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
    periodic = ("recover()", "fire_timers()", "stats", "retention claim", "versions check")
    for label in (*periodic, "gauges", "limits"):
        assert f"\n-- {label}: " in done.stdout
    assert "list(rollback_status=stuck)" in done.stdout
    assert "archived 1000 runs" in done.stdout and "deleted 1000 runs" in done.stdout


def test_the_check_fails_when_the_recovery_sweep_loses_its_index() -> None:
    done = _history("--retire-runs", "0", "--without-index", "ix_saga_executions_unwind_owed")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr
    assert "READS HISTORY: recover() reads" in done.stdout


#: Parallel plans made free: the planner splits any read it can over workers.
#: Parallel workers made free, and index scans off, so that the planner's choice of a
#: parallel plan does not hang on what earlier tests of the session left in the tables.
_PARALLEL_FOR_FREE = (
    "SET LOCAL parallel_setup_cost = 0",
    "SET LOCAL parallel_tuple_cost = 0",
    "SET LOCAL min_parallel_table_scan_size = 0",
    "SET LOCAL min_parallel_index_scan_size = 0",
    "SET LOCAL enable_indexscan = off",
    "SET LOCAL enable_indexonlyscan = off",
    "SET LOCAL enable_bitmapscan = off",
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


def test_retention_finds_children_on_mariadb_by_seeking_the_parent_index() -> None:
    """With 200 parents or more in one IN list, MariaDB planned the children lookup from
    index statistics, where a NULL parent (nearly every run) looks like half the table: it
    read the whole index at every batch, 1.9 s a batch at 1M runs."""
    store = Database(mariadb_url())
    store.migrate()
    roots = [uuid.uuid4().hex for _ in range(20_000)]
    stamp = to_db_time(datetime.now(UTC))
    row = {"saga_name": "s", "definition_hash": "h", "state": "completed", "cursor": 0}
    row |= {"cursor_sub": 0, "input": b"", "created_at": stamp, "updated_at": stamp}
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        sent.append((sql, parameters))

    try:
        with store.transaction() as connection:
            connection.execute(insert(executions), [{**row, "id": i, "version": 1} for i in roots])
        with store.engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE TABLE saga_executions").all()
        event.listen(store.engine, "before_cursor_execute", record)
        with store.transaction() as connection:
            assert sorted(retention._families(connection, roots[:500])) == sorted(roots[:500])
        event.remove(store.engine, "before_cursor_execute", record)
        lookups = [(s, p) for s, p in sent if "parent_execution_id IN" in s]
        assert lookups
        with store.engine.connect() as connection:
            cursor = connection.connection.driver_connection.cursor()
            for sql, parameters in lookups:
                cursor.execute("EXPLAIN " + sql, parameters)
                access = {row[3] for row in cursor.fetchall()}
                assert access <= {"range", "ref"}, access
    finally:
        with store.transaction() as connection:
            connection.execute(delete(executions).where(executions.c.id.in_(roots)))
        store.dispose()


def _printed(command: list[str]) -> str:
    """What a benchmark printed, run from the repository on the test server; it must succeed."""
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "BENCH_ADMIN_URL": PG_ADMIN},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_the_variants_benchmark_runs_each_catch_up_beside_a_live_stream() -> None:
    """``benchmarks/history_variants.py`` on a tiny store: every kind of catch-up it names
    retires its runs beside the live stream, and the stream's latency is reported per phase
    (the figures on the scaling page come from it)."""
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    variants = ["current", "chunked:1", "async:0", "archive:0", "cleanup:0", "process:0"]
    variants.append("packed:0")
    command = [sys.executable, "benchmarks/history_variants.py", "--runs", "6000"]
    command += ["--retire-runs", "300", "--batch", "100", "--chunk", "50", "--live-rate", "5"]
    command += ["--live-seconds", "1", "--variants", *variants]
    command += ["--ids", "random", "--prearchive", "100"]
    out = _printed(command)
    assert out.count("archived 300 runs") == 6 and out.count("deleted 300 runs") == 6, out
    assert out.count(" kB a run") == 13 and "server: shared_buffers " in out
    assert "(random ids)" in out and "before: archived 100 runs" in out
    for index, variant in enumerate(variants, start=1):
        assert f"during {index}, {variant}" in out, out


def test_the_partition_experiment_drops_whole_days_beside_a_live_stream() -> None:
    """``--partitioned``: the engine runs unchanged on run tables partitioned by day of run
    id, the ``dropped`` variant retires whole days (at least the runs asked), the catch-up
    still retires runs one by one on it, and ``idle`` measures the stream's own noise."""
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    variants = ["idle", "dropped", "current:0/50"]
    command = [sys.executable, "benchmarks/history_variants.py", "--runs", "6000"]
    command += ["--retire-runs", "300", "--live-rate", "5", "--live-seconds", "1"]
    command += ["--partitioned", "--spread", "1", "--variants", *variants]
    out = _printed(command)
    dropped = re.search(r"dropped (\d+) partition\(s\), (\d+) runs", out)
    assert dropped and int(dropped[1]) >= 1 and int(dropped[2]) >= 300, out
    assert "nothing for 1 s" in out and "archived 300 runs" in out and "batch of 50" in out, out
    for index, variant in enumerate(variants, start=1):
        assert f"during {index}, {variant}" in out, out
