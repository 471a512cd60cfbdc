"""Optional per-task instrumentation for ``chain_vs_saga.py --profile`` (off by default).

Imported by ``bench_app`` only when ``BENCH_PROFILE=1``. Inside the worker's pool processes
it records, for every ``bench.write`` (chain) and ``bench_five.<step>`` (saga step) task, from
``task_prerun`` to ``task_postrun`` (which includes publishing the next message):

- wall and CPU time of the task,
- SQL statements (every ``before_cursor_execute`` of any engine), commits and pool
  pre-pings (each a round trip to PostgreSQL; psycopg adds one more for ``BEGIN``),
- for saga nodes, the time spent in the store calls of ``Executor.run_node``
  (``load_snapshot``, ``claim_step``, ``record_step_completed``), in publishing the next
  node, in the step body and in event emission; the rest is Celery/engine overhead.

Rows are buffered per process and written to the ``bench_profile`` table of the run's
schema in small batches (outside the measured task), and finally on process shutdown.
The wrappers cost microseconds per call; use the numbers of a run WITHOUT ``--profile`` for
the ratios against the targets.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from celery import signals
from sqlalchemy import Engine, event, text

PROFILE_TABLE = "bench_profile"
COLUMNS = ("ts", "pid", "kind", "wall_ms", "cpu_ms", "statements", "commits", "pings",
           "snapshot_ms", "claim_ms", "record_ms", "publish_ms", "body_ms", "emit_ms")
TIMED = ("snapshot_ms", "claim_ms", "record_ms", "publish_ms", "body_ms", "emit_ms")
KINDS = {"bench.write": "chain"}
#: The saga's steps are tasks of their own, named ``bench_five.<step>``.
SAGA_PREFIX = "bench_five."

CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {PROFILE_TABLE} (ts DOUBLE PRECISION NOT NULL, "
    "pid INTEGER NOT NULL, kind VARCHAR(16) NOT NULL, wall_ms DOUBLE PRECISION, "
    "cpu_ms DOUBLE PRECISION, statements INTEGER, commits INTEGER, pings INTEGER, "
    "snapshot_ms DOUBLE PRECISION, claim_ms DOUBLE PRECISION, record_ms DOUBLE PRECISION, "
    "publish_ms DOUBLE PRECISION, body_ms DOUBLE PRECISION, emit_ms DOUBLE PRECISION)"
)

_current: dict[str, Any] | None = None
_buffer: list[dict[str, Any]] = []
_last_flush = [time.monotonic()]
_engine_getter: list[Callable[[], Engine]] = []


def _timed(field: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _current is None:
            return function(*args, **kwargs)
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            if _current is not None:
                _current[field] += (time.perf_counter() - started) * 1000
    return wrapper


def _count(field: str) -> Callable[..., None]:
    def listener(*_args: Any, **_kwargs: Any) -> None:
        if _current is not None:
            _current[field] += 1
    return listener


def _on_prerun(sender: Any = None, task: Any = None, **_kwargs: Any) -> None:
    global _current
    name = getattr(task, "name", "")
    kind = "saga" if name.startswith(SAGA_PREFIX) else KINDS.get(name)
    if kind is None:
        return
    _current = {"kind": kind, "statements": 0, "commits": 0, "pings": 0,
                **dict.fromkeys(TIMED, 0.0),
                "_wall": time.perf_counter(), "_cpu": time.process_time()}


def _on_postrun(**_kwargs: Any) -> None:
    global _current
    current, _current = _current, None
    if current is None:
        return
    current["wall_ms"] = (time.perf_counter() - current.pop("_wall")) * 1000
    current["cpu_ms"] = (time.process_time() - current.pop("_cpu")) * 1000
    current["ts"], current["pid"] = time.time(), os.getpid()
    _buffer.append(current)
    if len(_buffer) >= 200 or time.monotonic() - _last_flush[0] > 0.5:
        flush()


def flush(**_kwargs: Any) -> None:
    """Write buffered rows (outside any measured task)."""
    if not _buffer or not _engine_getter:
        return
    rows = [{name: row.get(name) for name in COLUMNS} for row in _buffer]
    _buffer.clear()
    _last_flush[0] = time.monotonic()
    placeholders = ", ".join(f":{name}" for name in COLUMNS)
    try:
        with _engine_getter[0]().begin() as connection:
            connection.execute(
                text(f"INSERT INTO {PROFILE_TABLE} ({', '.join(COLUMNS)}) VALUES ({placeholders})"),
                rows,
            )
    except Exception as error:  # profiling must never break the benchmark
        print(f"bench_profile: could not write {len(rows)} rows: {error!r}", flush=True)


def install(app_module: Any) -> None:
    """Wrap the executor's store/publish/body calls and listen to task signals."""
    saga_engine, engine_getter = app_module.engine, app_module.bench_db
    from celery_saga.runtime.executor import Executor
    from celery_saga.store import forward, queries
    from celery_saga.worker.events import EventHub
    from celery_saga.worker.publisher import CeleryPublisher

    _engine_getter.append(engine_getter)
    queries.load_snapshot = _timed("snapshot_ms", queries.load_snapshot)
    forward.claim_step = _timed("claim_ms", forward.claim_step)
    forward.record_step_completed = _timed("record_ms", forward.record_step_completed)
    CeleryPublisher.publish_node = _timed("publish_ms", CeleryPublisher.publish_node)
    Executor._invoke = _timed("body_ms", Executor._invoke)
    app_module.insert_row = _timed("body_ms", app_module.insert_row)
    EventHub.__call__ = _timed("emit_ms", EventHub.__call__)

    event.listen(Engine, "before_cursor_execute", _count("statements"))
    event.listen(Engine, "commit", _count("commits"))
    dialect_class = type(saga_engine.db.engine.dialect)
    dialect_class.do_ping = _counting_ping(dialect_class.do_ping)

    signals.task_prerun.connect(_on_prerun, weak=False)
    signals.task_postrun.connect(_on_postrun, weak=False)
    signals.worker_process_shutdown.connect(flush, weak=False)


def _counting_ping(do_ping: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(do_ping)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _current is not None:
            _current["pings"] += 1
        return do_ping(*args, **kwargs)
    return wrapper


def summarize(connection: Any, windows: dict[str, tuple[float, float]]) -> list[str]:
    """Per phase and kind: mean per task of every recorded column."""
    lines = []
    header = (f"  {'phase':<11} {'kind':<6} {'tasks':>6} {'wall':>6} {'cpu':>6} {'stmts':>6} "
              f"{'commit':>6} {'ping':>5} {'snap':>6} {'claim':>6} {'record':>6} "
              f"{'publish':>7} {'body':>6} {'emit':>6} {'other':>6}")
    lines.append(header)
    for phase, (start, end) in windows.items():
        for kind in ("chain", "saga"):
            row = connection.execute(text(
                f"SELECT count(*), avg(wall_ms), avg(cpu_ms), avg(statements), avg(commits), "
                f"avg(pings), avg(snapshot_ms), avg(claim_ms), avg(record_ms), "
                f"avg(publish_ms), avg(body_ms), avg(emit_ms) FROM {PROFILE_TABLE} "
                "WHERE kind = :k AND ts BETWEEN :a AND :b"), {"k": kind, "a": start, "b": end}
            ).one()
            count = row[0]
            if not count:
                continue
            values = [float(v or 0) for v in row[1:]]
            wall, cpu, stmts, commits, pings, snap, claim, record, publish, body, emit = values
            # chain: body = the INSERT; its next-link publish is inside Celery's tracer, so
            # it is part of "other" there.
            other = wall - (snap + claim + record + publish + body + emit)
            lines.append(
                f"  {phase:<11} {kind:<6} {count:>6} {wall:6.2f} {cpu:6.2f} {stmts:6.2f} "
                f"{commits:6.2f} {pings:5.2f} {snap:6.2f} {claim:6.2f} {record:6.2f} "
                f"{publish:7.2f} {body:6.2f} {emit:6.2f} {other:6.2f}")
    return lines
