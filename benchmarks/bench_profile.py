"""Optional per-task instrumentation for ``chain_vs_saga.py --profile`` (off by default).

Imported by ``bench_app`` only when ``BENCH_PROFILE=1``. Inside the worker's pool processes
it records, for every ``bench.write`` (chain), ``bench_five.<step>`` (saga step) and
``bench_unwind.<step>[.compensate]`` (unwinding saga: forward step, failing step, reversal)
task, from ``task_prerun`` to ``task_postrun`` (which includes publishing the next message):

- wall and CPU time of the task,
- SQL statements (every ``before_cursor_execute`` of any engine), explicit COMMITs and pool
  pre-pings (each a round trip to PostgreSQL; psycopg adds one more for ``BEGIN``),
- durable commits: server transactions that wrote something, so must flush WAL before they
  return (a write statement run in autocommit, or an explicit transaction with a write; a
  claim that sets ``synchronous_commit`` off for its own transaction does not count),
- for saga nodes, the time spent in the store calls of ``Executor.run_node``
  (``load_snapshot``, ``claim_step``, ``record_step_completed``; for a reversal
  ``claim_next_reversal`` and ``record_compensation``), in publishing the next node or
  reversal, in the step body and in event emission; the rest is Celery/engine overhead.

- the host-clock time of the task's start and end, and of the first call and last return
  of its claim, outcome write and publish, with the run's id: ``bench_hop_split`` splits
  each hop of the single runs with them.

The store's statements are counted through the store's own statement counter, which it also
calls for the statements it sends straight to the driver: a listener of its engine's
statement events would make it run them through SQLAlchemy instead, and the profile would
time another path than the one an unprofiled worker runs.

Rows are buffered per process and written to the ``bench_profile`` table of the run's
schema in small batches (outside the measured task), and finally on process shutdown.
The wrappers cost microseconds per call; use the numbers of a run WITHOUT ``--profile`` for
the ratios against the targets.
"""

from __future__ import annotations

import functools
import os
import re
import time
import weakref
from collections.abc import Callable
from typing import Any

from celery import signals
from sqlalchemy import Engine, event, text

PROFILE_TABLE = "bench_profile"
COLUMNS = (
    "ts",
    "pid",
    "kind",
    "wall_ms",
    "cpu_ms",
    "statements",
    "commits",
    "durable",
    "pings",
    "snapshot_ms",
    "claim_ms",
    "record_ms",
    "publish_ms",
    "body_ms",
    "emit_ms",
    "run_id",
    *(f"t_{point}" for point in ("start", "end")),
    *(f"t_{field}_{edge}" for field in ("claim", "record", "publish") for edge in ("in", "out")),
)
TIMED = ("snapshot_ms", "claim_ms", "record_ms", "publish_ms", "body_ms", "emit_ms")
KINDS = {"bench.write": "chain", "bench.fail": "chain-fail", "bench_unwind.s5": "unwind-fail"}
#: Every saga step is a task of its own, named ``<saga>.<step>``; a reversal adds
#: ``.compensate``.
PREFIXES = (("bench_five.", "saga"), ("bench_unwind.", "unwind-fwd"))
#: Write statements; a row lock (``FOR UPDATE``, ``FOR NO KEY UPDATE``) is not one.
_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
#: A statement that sets this for its own transaction does not wait for its WAL flush.
_NO_FLUSH_WAIT = "set_config('synchronous_commit', 'off', true)"
_ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.IGNORECASE)

CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {PROFILE_TABLE} (ts DOUBLE PRECISION NOT NULL, "
    "pid INTEGER NOT NULL, kind VARCHAR(16) NOT NULL, wall_ms DOUBLE PRECISION, "
    "cpu_ms DOUBLE PRECISION, statements INTEGER, commits INTEGER, durable INTEGER, "
    "pings INTEGER, "
    "snapshot_ms DOUBLE PRECISION, claim_ms DOUBLE PRECISION, record_ms DOUBLE PRECISION, "
    "publish_ms DOUBLE PRECISION, body_ms DOUBLE PRECISION, emit_ms DOUBLE PRECISION, "
    "run_id VARCHAR(64), "
    + ", ".join(f"{name} DOUBLE PRECISION" for name in COLUMNS if name.startswith("t_"))
    + ")"
)

_current: dict[str, Any] | None = None
_buffer: list[dict[str, Any]] = []
_last_flush = [time.monotonic()]
_engine_getter: list[Callable[[], Engine]] = []


def _timed(field: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # The first call's start and the last call's end, on the host's clock (the hop split in
    # bench_hop_split compares them across pool processes): "claim_ms" -> "t_claim_in".
    first_in, last_out = (f"t_{field.removesuffix('_ms')}_{edge}" for edge in ("in", "out"))

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _current is None:
            return function(*args, **kwargs)
        started = time.perf_counter()
        _current.setdefault(first_in, time.time())
        try:
            return function(*args, **kwargs)
        finally:
            if _current is not None:
                _current[field] += (time.perf_counter() - started) * 1000
                _current[last_out] = time.time()

    return wrapper


def _is_write(statement: str) -> bool:
    return _WRITE.search(_ROW_LOCK.sub("", statement)) is not None


def _on_statement(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
    """Count the statement; a write is durable at once in autocommit, else at COMMIT,
    unless it commits without waiting for its WAL flush (a claim, ``saga_durable_claims``)."""
    if _current is None:
        return
    _current["statements"] += 1
    if not _is_write(statement) or _NO_FLUSH_WAIT in statement:
        return
    if getattr(conn.connection.dbapi_connection, "autocommit", False):
        _current["durable"] += 1
    else:
        conn.info["bench_wrote"] = True


def _on_commit(conn: Any) -> None:
    if _current is None:
        return
    _current["commits"] += 1
    if conn.info.pop("bench_wrote", False):
        _current["durable"] += 1


def _on_rollback(conn: Any) -> None:
    conn.info.pop("bench_wrote", None)


def kind_of(name: str) -> str | None:
    """The profile kind of a task name, or None for a task that is not measured."""
    if name in KINDS:
        return KINDS[name]
    if name.endswith(".compensate"):
        return "reversal"
    return next((kind for prefix, kind in PREFIXES if name.startswith(prefix)), None)


def _on_prerun(sender: Any = None, task: Any = None, **_kwargs: Any) -> None:
    global _current
    kind = kind_of(getattr(task, "name", ""))
    if kind is None:
        return
    _current = {
        "kind": kind,
        "statements": 0,
        "commits": 0,
        "durable": 0,
        "pings": 0,
        **dict.fromkeys(TIMED, 0.0),
        "run_id": _run_of(task),
        "t_start": time.time(),
        "_wall": time.perf_counter(),
        "_cpu": time.process_time(),
    }


def _run_of(task: Any) -> str | None:
    """The execution id in the saga header of the message ``task`` runs (None: a chain)."""
    from celery_saga.worker.saga_header import read_header

    header = read_header(task.request)
    return None if header is None else str(header["id"])


def _on_postrun(**_kwargs: Any) -> None:
    global _current
    current, _current = _current, None
    if current is None:
        return
    current["wall_ms"] = (time.perf_counter() - current.pop("_wall")) * 1000
    current["cpu_ms"] = (time.process_time() - current.pop("_cpu")) * 1000
    current["ts"], current["pid"] = time.time(), os.getpid()
    current["t_end"] = current["ts"]
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


def count_store_statements() -> None:
    """Count the store's statements with the counter it tells of every statement, the ones
    it sends straight to the driver included. Call before the store is created."""
    from celery_saga.store.database import Database

    counted = Database._count

    def _count(self: Any, conn: Any, cursor: Any, statement: str, *rest: Any) -> Any:
        _on_statement(conn, cursor, statement)
        return counted(self, conn, cursor, statement, *rest)

    Database._count = _count  # type: ignore[method-assign]


def install(app_module: Any) -> None:
    """Wrap the executor's store/publish/body calls and listen to task signals."""
    saga_engine, engine_getter = app_module.engine, app_module.bench_db
    from celery_saga.runtime.executor import Executor
    from celery_saga.store import forward, queries, reversal
    from celery_saga.worker.event_hub import EventHub
    from celery_saga.worker.publisher import CeleryPublisher

    _engine_getter.append(engine_getter)
    for owner, attribute, field in (
        (queries, "load_snapshot", "snapshot_ms"),
        (forward, "claim_step", "claim_ms"),
        (forward, "record_step_completed", "record_ms"),
        (reversal, "claim_next_reversal", "claim_ms"),
        (reversal, "record_compensation", "record_ms"),
        (CeleryPublisher, "publish_node", "publish_ms"),
        (CeleryPublisher, "publish_compensation", "publish_ms"),
        (Executor, "_invoke", "body_ms"),  # gone since steps became tasks: body not timed
        (app_module, "insert_row", "body_ms"),
        (EventHub, "__call__", "emit_ms"),
    ):
        if hasattr(owner, attribute):  # the engine's internals move; time what is there
            setattr(owner, attribute, _timed(field, getattr(owner, attribute)))

    # Statements of the chain's engine are seen through its events; the store's through its
    # own counter (see count_store_statements): a listener of its engine's statement events
    # would make it run its hot path through SQLAlchemy instead of straight to the driver.
    original_db = app_module.bench_db
    listened: weakref.WeakSet[Engine] = weakref.WeakSet()

    @functools.wraps(original_db)
    def bench_db() -> Engine:
        engine = original_db()
        if engine not in listened:  # a new engine after a fork gets its listener too
            event.listen(engine, "before_cursor_execute", _on_statement)
            listened.add(engine)
        return engine

    app_module.bench_db = bench_db
    event.listen(Engine, "commit", _on_commit)
    event.listen(Engine, "rollback", _on_rollback)
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


ALL_KINDS = ("chain", "chain-fail", "saga", "unwind-fwd", "unwind-fail", "reversal")
_MEANS = ("wall_ms", "cpu_ms", "statements", "commits", "durable", "pings", *TIMED)


def means(connection: Any, start: float, end: float) -> dict[str, dict[str, float]]:
    """Per kind recorded between ``start`` and ``end``: the task count and column means."""
    columns = ", ".join(f"avg({name})" for name in _MEANS)
    result = {}
    for kind in ALL_KINDS:
        row = connection.execute(
            text(
                f"SELECT count(*), {columns} FROM {PROFILE_TABLE} "
                "WHERE kind = :k AND ts BETWEEN :a AND :b"
            ),
            {"k": kind, "a": start, "b": end},
        ).one()
        if row[0]:
            values = (float(v or 0) for v in row[1:])
            result[kind] = {"tasks": row[0], **dict(zip(_MEANS, values, strict=True))}
    return result


def summarize(connection: Any, windows: dict[str, tuple[float, float]]) -> list[str]:
    """Per phase and kind: mean per task of every recorded column."""
    lines = [
        f"  {'phase':<11} {'kind':<11} {'tasks':>6} {'wall':>6} {'cpu':>6} {'stmts':>6} "
        f"{'commit':>6} {'durabl':>6} {'ping':>5} {'snap':>6} {'claim':>6} {'record':>6} "
        f"{'publish':>7} {'body':>6} {'emit':>6} {'other':>6}"
    ]
    for phase, (start, end) in windows.items():
        for kind, m in means(connection, start, end).items():
            # chain: body = the INSERT; its next-link publish is inside Celery's tracer, so
            # it is part of "other" there.
            other = m["wall_ms"] - sum(m[name] for name in TIMED)
            lines.append(
                f"  {phase:<11} {kind:<11} {m['tasks']:>6} {m['wall_ms']:6.2f} "
                f"{m['cpu_ms']:6.2f} {m['statements']:6.2f} {m['commits']:6.2f} "
                f"{m['durable']:6.2f} {m['pings']:5.2f} {m['snapshot_ms']:6.2f} "
                f"{m['claim_ms']:6.2f} {m['record_ms']:6.2f} {m['publish_ms']:7.2f} "
                f"{m['body_ms']:6.2f} {m['emit_ms']:6.2f} {other:6.2f}"
            )
    return lines
