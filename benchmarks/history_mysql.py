"""The history benchmark on MySQL/MariaDB: the same store, the same calls, their plans.

``--mysql`` sends ``history.py`` here: a database of its own (``--mysql-database``) gets the
history of ``history_fill.py`` (the same runs and steps, written server side from MariaDB's
``seq_<a>_to_<b>`` tables, so MariaDB only), ``ANALYZE TABLE``, and then each sweep and
operator read is timed and its statements are run under ``ANALYZE FORMAT=JSON``: for every
table a plan reads, the access path, the index, and the rows it really read (``r_rows``
times ``r_loops``). ``--check`` fails when a statement reads more rows of saga_executions
than the unfinished runs and a batch: on a big store, that is a plan that reads history.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from history_fill import CHUNK, SPREAD_DAYS, STEPS
from history_plans import RUNS_TABLE, Statement, statements_of
from sqlalchemy import Connection, Engine, create_engine, text

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/celery_saga_bench_hist"

RUNS_SQL = """
INSERT INTO saga_executions (id, saga_name, definition_hash, state, `cursor`, cursor_sub,
    input, failure_reason, rollback_status, rollback_reason, committed_at,
    parent_execution_id, lease_expires_at, wake_at, created_at, updated_at, version)
SELECT MD5(CONCAT(:prefix, s.seq)), CONCAT('order_', s.seq % 4), REPEAT('ab', 32),
    IF(:failing AND s.seq % 5 = 0, 'failed', :state),
    IF(:failing AND s.seq % 5 = 0, 4, :cursor), 0,
    UNHEX('81a5636172747393cd04d2cd162ecd2382'),
    IF(:failing AND s.seq % 5 = 0, 'PaymentDeclined: card 4242 declined by the issuer', NULL),
    IF(:failing AND s.seq % 5 = 0, IF(s.seq % 5000 = 0, 'stuck', 'completed'), NULL),
    NULL, NULL, NULL, NULL, :wake_at,
    :start + INTERVAL ((s.seq - :first) * :gap) MICROSECOND,
    :start + INTERVAL ((s.seq - :first) * :gap) MICROSECOND + INTERVAL 2 SECOND, 11
FROM {sequence} AS s
"""

STEPS_SQL = """
INSERT INTO saga_steps (execution_id, name, node, sub, status, attempts, idempotency_key,
    compensatable, result, error, lease_expires_at, started_at, completed_at,
    compensation_status, compensation_reason, compensated_at, compensation_attempts,
    compensation_lease_expires_at, child_execution_id, holder, compensation_holder)
SELECT e.id, CONCAT('step_', k.seq), k.seq, 0,
    IF(e.state = 'failed' AND k.seq = 4, 'failed', 'completed'), 1,
    CONCAT(e.id, '|step_', k.seq, '|0|forward'), 1,
    IF(e.state = 'failed' AND k.seq = 4, NULL, UNHEX('82a26964cd3039a6737461747573a26f6b')),
    IF(e.state = 'failed' AND k.seq = 4, 'PaymentDeclined: card declined', NULL), NULL,
    e.created_at + INTERVAL (k.seq * 300000) MICROSECOND,
    e.created_at + INTERVAL (k.seq * 300000 + 200000) MICROSECOND,
    IF(e.state = 'failed', 'compensated', NULL), NULL,
    IF(e.state = 'failed', e.updated_at, NULL),
    IF(e.state = 'failed', 1, 0), NULL, NULL, NULL, NULL
FROM {sequence} AS s
JOIN saga_executions AS e ON e.id = MD5(CONCAT(:prefix, s.seq))
JOIN seq_0_to_{last_step} AS k ON k.seq <= e.`cursor`
"""


def _insert(connection: Connection, prefix: str, first: int, last: int, **values: Any) -> None:
    sequence = f"seq_{first}_to_{last}"
    values = {"prefix": prefix, "first": first, "failing": False, "wake_at": None, **values}
    values["gap"] = int(values["gap"] / timedelta(microseconds=1))
    connection.execute(text(RUNS_SQL.format(sequence=sequence)), values)
    steps = STEPS_SQL.format(sequence=sequence, last_step=STEPS - 1)
    connection.execute(text(steps), {"prefix": prefix})


def fill(engine: Engine, runs: int, waiting: int, live: int, parked: int, now: datetime) -> float:
    """``history_fill.fill`` for MariaDB; naive UTC times, as the store keeps them."""
    began, now = time.monotonic(), now.replace(tzinfo=None)
    start = now - timedelta(days=SPREAD_DAYS)
    gap = timedelta(days=SPREAD_DAYS - 1) / max(runs, 1)
    for first in range(0, runs, CHUNK):
        last = min(first + CHUNK, runs) - 1
        with engine.begin() as connection:
            _insert(
                connection, "done", first, last, state="completed", cursor=STEPS - 1,
                start=start + first * gap, gap=gap, failing=True,
            )  # fmt: skip
    with engine.begin() as connection:
        for prefix, count, state, cursor, wake_at in (
            ("wait", waiting, "waiting", 2, now + timedelta(days=1)),
            ("live", live, "running", 1, None),
            ("park", parked, "compensation_stuck", 3, None),
        ):
            if count:
                started = now if state == "running" else now - timedelta(hours=1)
                _insert(
                    connection, prefix, 0, count - 1, state=state, cursor=cursor,
                    start=started, gap=timedelta(0), wake_at=wake_at,
                )  # fmt: skip
        connection.execute(
            text(
                "UPDATE saga_executions SET rollback_status = 'stuck' "
                "WHERE state = 'compensation_stuck'"
            )
        )
    return time.monotonic() - began


@dataclass(frozen=True)
class Access:
    """How one plan reads one table."""

    table: str
    access_type: str
    key: str | None
    rows: float
    filesort: bool

    def line(self) -> str:
        sort = " [under a filesort]" if self.filesort else ""
        key = f" using {self.key}" if self.key else ""
        return f"{self.access_type}{key} on {self.table} rows={self.rows:.0f}{sort}"


def _accesses(tree: Any, filesort: bool = False) -> Iterator[Access]:
    if isinstance(tree, list):
        for item in tree:
            yield from _accesses(item, filesort)
    elif isinstance(tree, dict):
        sorted_here = filesort or "filesort" in tree
        if "table_name" in tree:
            loops = tree.get("r_loops", 1) or 0
            yield Access(
                tree["table_name"],
                tree.get("access_type", "?"),
                tree.get("key"),
                float(tree.get("r_rows", 0) or 0) * loops,
                sorted_here,
            )
        for value in tree.values():
            yield from _accesses(value, sorted_here)


def analyze(engine: Engine, statement: Statement) -> list[Access]:
    """The executed plan of ``statement`` (in a transaction rolled back)."""
    with engine.connect() as connection:
        transaction = connection.begin()
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("ANALYZE FORMAT=JSON " + statement.sql, statement.parameters)
        tree = json.loads(cursor.fetchone()[0])
        transaction.rollback()
    return list(_accesses(tree))


def report(engine: Engine, calls: dict[str, Callable[[], object]], limit: int | None) -> list[str]:
    """Print the plans of each call's statements; what reads history (when ``limit``)."""
    problems = []
    for name, call in calls.items():
        statements = statements_of(engine, call)
        print(f"\n-- {name}: {len(statements)} statement(s)")
        for statement in statements:
            accesses = analyze(engine, statement)
            read = sum(a.rows for a in accesses if a.table == RUNS_TABLE)
            print(f"   rows read from saga_executions: {read:.0f}")
            for access in accesses:
                print(f"     {access.line()}")
            # MariaDB has no switch to plan a small table as a big one (PostgreSQL's
            # enable_seqscan): a scan of a small store is right, of a big one it reads history.
            if limit is not None and read > limit:
                problems.append(f"{name} reads {read:.0f} runs (at most {limit} expected)")
    return problems


def measure(args: argparse.Namespace, timed: Callable[[str], int]) -> int:
    """``timed(url)`` on a fresh database of ``--mysql-url``, dropped afterwards."""
    url = args.mysql_url
    database = url.rsplit("/", 1)[1]
    server = create_engine(url.rsplit("/", 1)[0] + "/", isolation_level="AUTOCOMMIT")
    with server.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {database}"))
        connection.execute(text(f"CREATE DATABASE {database}"))
    try:
        return timed(url)
    finally:
        with server.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {database}"))
        server.dispose()


def analyze_tables(engine: Engine) -> None:
    with engine.connect() as connection:
        for table in ("saga_executions", "saga_steps"):
            connection.execute(text(f"ANALYZE TABLE {table}")).all()
