"""Filling a PostgreSQL store with a realistic history, in bulk, server side.

Finished five-step runs: 80% completed, 20% failed with every step reversed (one in a
thousand of those abandoned, rollback ``stuck``), each with its history as the engine
writes it: the ``started`` row and one row per step attempt. Beside them: runs waiting for a signal
with a deadline in a day, live runs moving now, and a few parked ones. Rows are written by
``INSERT ... SELECT generate_series(...)`` in chunks, not through the engine: a million runs
take a minute, not hours. Ids are the engine's (``ids="ordered"``: a version-7 UUID's
text, its first 48 bits the run's creation in milliseconds) or, to measure what they replaced,
random (``ids="random"``: an md5, as random as a version-4 UUID).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, text

STEPS = 5
CHUNK = 100_000
#: Finished runs are spread over this many days before the fill starts.
SPREAD_DAYS = 60

#: SQL of a run's id from the series number ``g`` (``:prefix``, ``:start``, ``:gap``, ``:first``).
_MILLIS = (
    "lpad(to_hex(CAST(floor(extract(epoch FROM "
    "CAST(:start AS timestamptz) + (g - CAST(:first AS bigint)) * CAST(:gap AS interval)"
    ") * 1000) AS bigint)), 12, '0')"
)
_RANDOM = "md5(:prefix || g::text)"
IDS = {
    "random": _RANDOM,
    "ordered": (
        f"substr({_MILLIS}, 1, 8) || '-' || substr({_MILLIS}, 9, 4) || '-7' "
        f"|| substr({_RANDOM}, 1, 3) || '-8' || substr({_RANDOM}, 4, 3) || '-' "
        f"|| substr({_RANDOM}, 7, 12)"
    ),
}

RUNS_SQL = """
INSERT INTO saga_executions (id, saga_name, definition_hash, state, cursor, cursor_sub, input,
    failure_reason, rollback_status, rollback_reason, committed_at, parent_execution_id,
    lease_expires_at, wake_at, created_at, updated_at, version)
SELECT {id}, 'order_' || (g % 4), repeat('ab', 32),
    CASE WHEN failing THEN 'failed' ELSE CAST(:state AS text) END,
    CASE WHEN failing THEN 4 ELSE CAST(:cursor AS integer) END, 0,
    '\\x81a5636172747393cd04d2cd162ecd2382'::bytea,
    CASE WHEN failing THEN 'PaymentDeclined: card 4242 declined by the issuer' END,
    CASE WHEN failing THEN (CASE WHEN g % 5000 = 0 THEN 'stuck' ELSE 'completed' END) END,
    NULL, NULL, NULL, NULL, CAST(:wake_at AS timestamptz),
    :start + (g - CAST(:first AS bigint)) * :gap,
    :start + (g - CAST(:first AS bigint)) * :gap + interval '2 seconds', 11
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g,
    LATERAL (SELECT CAST(:failing AS boolean) AND g % 5 = 0 AS failing) AS f
"""

STEPS_SQL = """
INSERT INTO saga_steps (execution_id, name, node, sub, status, attempts, idempotency_key,
    compensatable, result, error, lease_expires_at, started_at, completed_at,
    compensation_status, compensation_reason, compensated_at, compensation_attempts,
    compensation_lease_expires_at, child_execution_id, holder, compensation_holder)
SELECT e.id, 'step_' || k, k, 0,
    CASE WHEN e.state = 'failed' AND k = 4 THEN 'failed' ELSE 'completed' END, 1,
    e.id || '|step_' || k || '|0|forward', true,
    CASE WHEN e.state = 'failed' AND k = 4 THEN NULL
         ELSE '\\x82a26964cd3039a6737461747573a26f6b'::bytea END,
    CASE WHEN e.state = 'failed' AND k = 4 THEN 'PaymentDeclined: card declined' END, NULL,
    e.created_at + k * interval '300 milliseconds',
    e.created_at + k * interval '300 milliseconds' + interval '200 milliseconds',
    CASE WHEN e.state = 'failed' THEN 'compensated' END, NULL,
    CASE WHEN e.state = 'failed' THEN e.updated_at END,
    CASE WHEN e.state = 'failed' THEN 1 ELSE 0 END, NULL, NULL, NULL, NULL
FROM saga_executions AS e, generate_series(0, CAST(:steps AS integer) - 1) AS k
WHERE e.id IN (
        SELECT {id}
        FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    )
    AND k <= e.cursor
"""

HISTORY_SQL = """
INSERT INTO saga_history (execution_id, at, kind, step, attempt, holder, started_at, detail)
SELECT e.id, e.created_at, 'started', NULL, NULL, NULL, NULL, NULL
FROM saga_executions AS e
WHERE e.id IN (
        SELECT {id}
        FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    )
UNION ALL
SELECT s.execution_id, s.completed_at,
    CASE WHEN s.status = 'failed' THEN 'step-failed' ELSE 'step-completed' END,
    s.name, 1, 'celery@worker-1/4242/' || md5(s.execution_id || s.name), s.started_at, s.error
FROM saga_steps AS s
WHERE s.execution_id IN (
        SELECT {id}
        FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    )
    AND s.completed_at IS NOT NULL
"""


def _insert(
    connection: Connection,
    prefix: str,
    first: int,
    last: int,
    *,
    state: str,
    cursor: int,
    start: datetime,
    gap: timedelta,
    wake_at: datetime | None = None,
    failing: bool = False,
    ids: str = "ordered",
) -> None:
    values = {
        "failing": failing,
        "prefix": prefix,
        "first": first,
        "last": last,
        "state": state,
        "cursor": cursor,
        "start": start,
        "gap": gap,
        "wake_at": wake_at,
        "steps": STEPS,
    }
    for sql in (RUNS_SQL, STEPS_SQL, HISTORY_SQL):
        connection.execute(text(sql.replace("{id}", IDS[ids])), values)


def fill(
    engine: Engine,
    runs: int,
    waiting: int,
    live: int,
    parked: int,
    now: datetime,
    ids: str = "ordered",
) -> float:
    """Write the history and the unfinished runs; returns the seconds it took."""
    began = time.monotonic()
    start = now - timedelta(days=SPREAD_DAYS)
    gap = timedelta(days=SPREAD_DAYS - 1) / max(runs, 1)
    for first in range(0, runs, CHUNK):
        last = min(first + CHUNK, runs) - 1
        with engine.begin() as connection:
            _insert(
                connection,
                "done",
                first,
                last,
                state="completed",
                cursor=STEPS - 1,
                start=start + first * gap,
                gap=gap,
                failing=True,
                ids=ids,
            )
    with engine.begin() as connection:
        hour = timedelta(hours=1)
        _unfinished(connection, waiting, live, parked, now, hour, ids)
    return time.monotonic() - began


def _unfinished(
    connection: Connection,
    waiting: int,
    live: int,
    parked: int,
    now: datetime,
    hour: timedelta,
    ids: str,
) -> None:
    for prefix, count, state, cursor, wake_at in (
        ("wait", waiting, "waiting", 2, now + timedelta(days=1)),
        ("live", live, "running", 1, None),
        ("park", parked, "compensation_stuck", 3, None),
    ):
        if count:
            started = now if state == "running" else now - hour
            _insert(
                connection,
                prefix,
                0,
                count - 1,
                state=state,
                cursor=cursor,
                start=started,
                gap=timedelta(0),
                wake_at=wake_at,
                ids=ids,
            )
    connection.execute(
        text(
            "UPDATE saga_executions SET rollback_status = 'stuck' "
            "WHERE state = 'compensation_stuck'"
        )
    )


def vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for table in (
            "saga_executions",
            "saga_steps",
            "saga_history",
            "saga_executions_archive",
            "saga_steps_archive",
            "saga_history_archive",
        ):
            connection.execute(text(f"VACUUM ANALYZE {table}"))
