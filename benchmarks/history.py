"""What the periodic sweeps and the operator reads cost as history piles up (issue 26).

For each ``--runs`` N, a PostgreSQL database of its own gets N finished five-step runs (80%
completed, 20% failed and compensated), ``--waiting`` runs parked on a signal, ``--live``
runs moving and ``--parked`` compensation_stuck ones (see ``history_fill.py``). Then, with
fresh statistics:

- the median of ``--repeats`` calls of ``recover()``, ``fire_timers()``, ``stats``,
  ``versions check`` and each ``list`` filter (none of the sweeps finds anything due: that
  is the beat's common case);
- the EXPLAIN ANALYZE of every statement they send, with the rows each read from
  ``saga_executions`` (``history_plans.py``);
- a retention catch-up over the whole history as backlog: ``--retire-runs`` runs archived,
  then as many deleted, batch by batch: runs/s and the median batch time of the first tenth
  of the batches against the last tenth. Between batches it rests ``--rest`` times the
  batch's duration, as ``retention.retire`` does (``retention.REST``; 0: flat out); with
  several ``--rest`` values, one catch-up after the other, each of ``--retire-runs``.

``--live-rate R`` (runs/s) starts five-step runs on a real worker at that steady rate during
the catch-up of the last N, and for ``--live-seconds`` before and after it, and prints their
latency p50/p95 during the catch-up beside the same stream without it (``history_live.py``).

``--mysql`` measures the same on MariaDB, in the database of ``--mysql-url``, with the plans
of ``ANALYZE FORMAT=JSON`` (``history_mysql.py``).

``--interleave`` fills one database per ``--runs`` N first, then times the operations on all
of them in one interleaved run (``history_compare.py``): every round calls each operation on
every store in turn, so the stores share the machine's noise and the ratio of the largest
to the smallest is what the history costs. It prints the server's planning plus execution
time of each operation's statements beside the wall time, and skips the catch-up.
``--reuse DB ...`` times databases a run filled before (one per ``--runs`` N, in order; a
3M fill takes a quarter of an hour) and keeps them; ``new`` in their place fills one.

``--check`` re-plans every statement with sequential scans off (a small store would be
scanned whole, a big one would not) and exits 1 when one of them reads more rows of
``saga_executions`` than the unfinished runs and a batch: it reads history.

    python benchmarks/history.py --runs 0 100000 1000000
    python benchmarks/history.py --runs 10000 --waiting 100 --live 20 --check --retire-runs 0
    python benchmarks/history.py --runs 1000000 --retire-runs 500000 --live-rate 10
    python benchmarks/history.py --runs 0 3000000 --interleave --repeats 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import history_compare
import history_mysql
from celery import Celery
from history_fill import fill, vacuum
from history_plans import Plan, Statement, explain, statements_of
from sqlalchemy import Engine, create_engine, text

from celery_saga import ExecutionState, SagaEngine
from celery_saga.store import inspection, retention

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BATCH = 500


def _operations(engine: SagaEngine, now: datetime) -> dict[str, Callable[[], object]]:
    """The sweeps (periodic: their plans are checked) and the operator reads."""
    day = inspection.Filters(
        created_after=now - timedelta(days=31), created_before=now - timedelta(days=30)
    )
    some = engine.list(limit=1).items
    first = some[0].id if some else "none"
    # `saga versions check` (an older checkout to compare with has no such call).
    check = getattr(engine, "check_versions", lambda: None)
    return {
        "recover()": lambda: engine.recover(),
        "fire_timers()": engine.fire_timers,
        "stats": lambda: inspection.stats(engine.db),
        "versions check": check,
        "gauges": _gauges(engine),
        "limits": lambda: engine.inspect().limits(20),
        "list()": lambda: engine.list(),
        "list(state=waiting)": lambda: engine.list(state="waiting"),
        "list(state=running)": lambda: engine.list(state="running"),
        "list(state=failed)": lambda: engine.list(state="failed"),
        "list(state=compensation_stuck)": lambda: engine.list(state="compensation_stuck"),
        "list(rollback_status=stuck)": lambda: engine.list(rollback_status="stuck"),
        "list(rollback_status=completed)": lambda: engine.list(rollback_status="completed"),
        "list(saga=order_1)": lambda: engine.list(saga="order_1"),
        "list(created on one day)": lambda: inspection.list_runs(
            engine.db, day, archived=False, limit=50, cursor=None
        ),
        # the web view's run list: newest first by default, its second page, a state
        "list(newest first, 2 pages)": lambda: _newest(engine, inspection.Filters()),
        "list(newest first, state=failed)": lambda: _newest(
            engine, inspection.Filters(states=[ExecutionState.FAILED]), pages=1
        ),
        "get(id)": lambda: engine.get(first),
    }


def _gauges(engine: SagaEngine) -> Callable[[], object]:
    """The metrics exporter's read of the store, every 15 s (``StoreGauges.refresh``; an
    older checkout to compare with may have none)."""
    try:
        from celery_saga.gauges import StoreGauges
    except ImportError:
        return lambda: None
    return StoreGauges(engine.db).refresh


def _newest(engine: SagaEngine, filters: inspection.Filters, pages: int = 2) -> None:
    cursor = None
    for _ in range(pages):
        page = inspection.list_runs(
            engine.db, filters, archived=False, limit=50, cursor=cursor, newest_first=True
        )
        cursor = page.next_cursor


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # the first call pays for connections and compiled statements
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _claims(engine: SagaEngine, cutoff: datetime) -> Callable[[], object]:
    """The retention claim of the first batch of each range and the look for the claimed
    runs' children, rolled back."""

    def claim() -> None:
        with engine.db.engine.connect() as connection:
            transaction = connection.begin()
            for index in range(len(retention._RANGES)):
                position = retention.Position(index)
                roots = retention._claim_candidates(connection, cutoff, BATCH, position)
                if roots:
                    retention._families(connection, [root for _, root in roots])
            transaction.rollback()

    return claim


def _plans(
    engine: SagaEngine, calls: dict[str, Callable[[], object]], check: bool
) -> dict[str, list[Plan]]:
    found: dict[str, list[Plan]] = {}
    for name, call in calls.items():
        statements: list[Statement] = statements_of(engine.db.engine, call)
        found[name] = [explain(engine.db.engine, s, no_seq_scan=check) for s in statements]
    return found


def _retire(
    engine: SagaEngine,
    cutoff: datetime,
    runs: int,
    archive: bool,
    rest: float = 0.0,
    batch: int = BATCH,
) -> str:
    position: retention.Position | None = retention.Position()
    wal = _wal_position(engine)
    times, gone, began = [], 0, time.perf_counter()
    while position is not None and gone < runs:
        started = time.perf_counter()
        count, position = retention.retire_batch(
            engine.db, cutoff=cutoff, now=cutoff, archive=archive, batch=batch, position=position
        )
        took = time.perf_counter() - started
        times.append(took * 1000)
        gone += count
        if count and rest > 0:  # as retention.retire rests between batches
            time.sleep(took * rest)
    elapsed = time.perf_counter() - began
    tenth = max(len(times) // 10, 1)
    first, last = statistics.median(times[:tenth]), statistics.median(times[-tenth:])
    verb = "archived" if archive else "deleted"
    written = _wal_since(engine, wal)
    wal_line = "" if written is None else f", WAL {written / max(gone, 1) / 1000:.1f} kB a run"
    return (
        f"{verb} {gone} runs in {elapsed:.1f} s: {gone / max(elapsed, 1e-9):,.0f} runs/s; "
        f"batch of {batch}: first tenth {first:.1f} ms, last tenth {last:.1f} ms "
        f"({last / max(first, 1e-9):.2f}x), {len(times)} batches, resting {rest:g}x{wal_line}"
    )


def _wal_position(engine: SagaEngine) -> str | None:
    """PostgreSQL's WAL insert position (None elsewhere)."""
    if engine.db.dialect != "postgresql":
        return None
    with engine.db.engine.connect() as connection:
        return str(connection.execute(text("SELECT pg_current_wal_lsn()")).scalar())


def _wal_since(engine: SagaEngine, start: str | None) -> float | None:
    """Bytes of WAL the server wrote since ``start`` (other work on the server included)."""
    if start is None:
        return None
    with engine.db.engine.connect() as connection:
        query = text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:start AS pg_lsn))")
        return float(connection.execute(query, {"start": start}).scalar() or 0)


def _catch_up(
    engine: SagaEngine, url: str, args: argparse.Namespace, runs: int, cutoff: datetime
) -> list[str]:
    """Archive, then delete, ``--retire-runs`` runs, once per ``--rest``; beside a live
    stream for the last N."""

    def both(rest: float) -> list[str]:
        return [
            _retire(engine, cutoff, args.retire_runs, True, rest, args.batch),
            _retire(engine, cutoff, args.retire_runs, False, rest, args.batch),
        ]

    print()
    if not args.live_rate or args.mysql or runs != args.runs[-1]:
        return [line for rest in args.rest for line in both(rest)]
    import history_live

    phases = {
        f"{index + 1}, resting {rest:g}x": (lambda rest=rest: both(rest))
        for index, rest in enumerate(args.rest)
    }
    return history_live.beside(url, args.live_rate, args.live_seconds, phases)


def _report_plans(plans: dict[str, list[Plan]], limit: int | None) -> list[str]:
    """Print each plan; return what reads history (only when ``limit`` is set)."""
    problems = []
    for name, found in plans.items():
        print(f"\n-- {name}: {len(found)} statement(s)")
        for plan in found:
            print(f"   rows read from saga_executions: {plan.rows_read}")
            for line in plan.lines():
                print(f"     {line}")
            if limit is not None and plan.rows_read > limit:
                problems.append(f"{name} reads {plan.rows_read} runs (at most {limit} expected)")
    return problems


def measure(admin_url: str, args: argparse.Namespace, runs: int) -> int:
    name = f"saga_history_{runs}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        return _measure(url, args, runs)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _store(url: str, args: argparse.Namespace) -> tuple[SagaEngine, Engine]:
    app = Celery(f"history-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    engine = SagaEngine(app, store_url=url)
    engine.ensure_schema()
    for index in args.without_index:
        with engine.db.engine.begin() as connection:
            connection.execute(text(f"DROP INDEX {index}"))
    return engine, create_engine(url)


def _measure(url: str, args: argparse.Namespace, runs: int) -> int:
    engine, bulk = _store(url, args)
    now = datetime.now(UTC)
    seconds = fill(bulk, runs, args.waiting, args.live, args.parked, now)
    vacuum(bulk)
    size = (
        bulk.connect()
        .execute(text("SELECT pg_size_pretty(pg_total_relation_size('saga_executions'))"))
        .scalar()
    )
    print(f"\n=== {runs:,} finished runs (filled in {seconds:.1f} s; saga_executions {size})")
    with bulk.begin() as connection:  # the live runs are moving: none is stale after a long fill
        connection.execute(
            text(
                "UPDATE saga_executions SET updated_at = now() AT TIME ZONE 'UTC' "
                "WHERE state = 'running'"
            )
        )

    def plans(calls: dict[str, Callable[[], object]], limit: int | None) -> list[str]:
        return _report_plans(_plans(engine, calls, args.check), limit)

    return _sweeps(engine, bulk, url, args, runs, now, plans)


def _filled(url: str, args: argparse.Namespace, runs: int, reuse: bool) -> history_compare.Store:
    engine, bulk = _store(url, args)
    now = datetime.now(UTC)
    if not reuse:
        seconds = fill(bulk, runs, args.waiting, args.live, args.parked, now)
        vacuum(bulk)
        history_compare.analyze(bulk)
        print(f"filled {runs:,} finished runs in {seconds:.1f} s", flush=True)
    bulk.dispose()
    calls = _operations(engine, now)
    return history_compare.Store(f"{runs:,}", engine.db.engine, calls)


def _moving(stores: list[history_compare.Store]) -> None:
    """The live runs are moving: none is stale for the recovery sweep after a long fill."""
    for store in stores:
        with store.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE saga_executions SET updated_at = now() AT TIME ZONE 'UTC' "
                    "WHERE state = 'running'"
                )
            )


def interleave(admin_url: str, args: argparse.Namespace) -> int:
    """Fill a database per ``--runs`` (or take the ``--reuse`` ones, kept afterwards; ``new``
    among them fills one), then time them all in one interleaved run."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    given = args.reuse or ["new"] * len(args.runs)
    names = [
        f"saga_history_{runs}_{uuid.uuid4().hex[:6]}" if name == "new" else name
        for runs, name in zip(args.runs, given, strict=True)
    ]
    made = [name for name, was in zip(names, given, strict=True) if was == "new"]
    stores = []
    try:
        for runs, name in zip(args.runs, names, strict=True):
            if name in made:
                with admin.connect() as connection:
                    connection.execute(text(f"CREATE DATABASE {name}"))
            url = admin_url.rsplit("/", 1)[0] + "/" + name
            stores.append(_filled(url, args, runs, reuse=name not in made))
        _moving(stores)
        history_compare.interleaved(stores, args.repeats)
        names_timed = list(stores[0].calls)
        server = {s.label: history_compare.server_times(s, names_timed) for s in stores}
        print(
            f"\n{args.repeats} interleaved rounds, medians (wall: the call; server: "
            "planning + execution of its statements):"
        )
        for line in history_compare.report(stores, server):
            print(line)
    finally:
        for store in stores:
            store.engine.dispose()
        with admin.connect() as connection:
            for name in made:
                connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
    return 0


def _measure_mysql(url: str, args: argparse.Namespace, runs: int) -> int:
    engine, bulk = _store(url, args)
    now = datetime.now(UTC)
    seconds = history_mysql.fill(bulk, runs, args.waiting, args.live, args.parked, now)
    history_mysql.analyze_tables(bulk)
    print(f"\n=== MySQL: {runs:,} finished runs (filled in {seconds:.1f} s)")
    with bulk.begin() as connection:
        connection.execute(
            text("UPDATE saga_executions SET updated_at = UTC_TIMESTAMP(6) WHERE state = 'running'")
        )

    def plans(calls: dict[str, Callable[[], object]], limit: int | None) -> list[str]:
        return history_mysql.report(engine.db.engine, calls, limit)

    return _sweeps(engine, bulk, url, args, runs, now, plans)


def _sweeps(
    engine: SagaEngine,
    bulk: Engine,
    url: str,
    args: argparse.Namespace,
    runs: int,
    now: datetime,
    plans: Callable[[dict[str, Callable[[], object]], int | None], list[str]],
) -> int:
    """Time the calls, print their plans, catch up; 1 when ``--check`` finds a plan that
    reads history."""
    calls = _operations(engine, now)
    for label, call in calls.items():
        print(f"  {label:34} {_median_ms(call, args.repeats):8.2f} ms")
    periodic = {
        k: calls[k] for k in ("recover()", "fire_timers()", "stats", "versions check", "gauges")
    }
    # An older checkout (to compare with) has no batch-wise retention to call.
    batched = hasattr(retention, "retire_batch")
    if batched:
        periodic["retention claim"] = _claims(engine, now - timedelta(minutes=30))
    reads = {k: v for k, v in calls.items() if k.startswith(("list", "get", "limits"))}
    unfinished = args.waiting + args.live + args.parked
    limit = 2 * (unfinished + BATCH) + 100 if args.check else None
    problems = plans({**periodic, **reads}, limit)
    if args.retire_runs and batched:
        for line in _catch_up(engine, url, args, runs, now - timedelta(minutes=30)):
            print("  " + line)
    engine.db.dispose()
    bulk.dispose()
    for problem in problems:
        print(f"READS HISTORY: {problem}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[0, 100_000])
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--parked", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--retire-runs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=BATCH, help="runs per retention batch")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--reuse", nargs="+", default=[], help="filled databases, as --runs")
    parser.add_argument("--live-rate", type=float, default=0.0)
    parser.add_argument("--live-seconds", type=float, default=30.0)
    parser.add_argument("--rest", type=float, nargs="+", default=[retention.REST])
    parser.add_argument("--without-index", action="append", default=[])
    parser.add_argument("--mysql", action="store_true")
    parser.add_argument("--mysql-url", default=history_mysql.DEFAULT_URL)
    args = parser.parse_args()
    if args.mysql:
        return max(
            history_mysql.measure(args, lambda url, n=runs: _measure_mysql(url, args, n))
            for runs in args.runs
        )
    admin_url = os.environ.get("BENCH_ADMIN_URL", DEFAULT_ADMIN_URL)
    if args.interleave:
        return interleave(admin_url, args)
    return max(measure(admin_url, args, runs) for runs in args.runs)


if __name__ == "__main__":
    sys.exit(main())
