"""Wide runs against as many one-step runs, with real prefork workers.

A ``for_each`` over N items and a parallel group of N members each do N steps in ONE run;
N one-step runs do as many steps in N runs that share no row. If an item or a member costs
the same whatever its index, the wide run takes about as long as the N one-step runs (a
``for_each`` runs its items one after another, so it is compared with N one-step runs
started one after another, each when the previous one finished; a group with N one-step
runs started at once). Per width and ``--rounds`` times, in one run of the script:

- the wall time from the first step's start to the last step's completion (worker
  timestamps), median of the rounds, and its ratio to the one-step runs;
- per-item time of the first tenth and of the last tenth of the steps, in the order they
  completed (the gaps between consecutive completions), medians, and their ratio;
- with ``--locks``, how many backends waited on a lock (``pg_stat_activity`` every 5 ms).

    python benchmarks/wide_runs.py --widths 10 100 500 1000 --rounds 3

The module is also the workers' Celery app (``-A benchmarks.wide_runs``). Environment:
``WIDE_BROKER_URL`` (RabbitMQ by default), ``WIDE_STORE_URL`` (a PostgreSQL database that
the run empties of saga rows: give it one of its own), ``WIDE_QUEUE``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from celery import Celery
from sqlalchemy import create_engine, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere, with this checkout's package

from celery_saga import Saga, SagaEngine, step  # noqa: E402
from celery_saga.store.tables import executions, metadata, step_records  # noqa: E402

BROKER_URL = os.environ.get("WIDE_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
STORE_URL = os.environ.get(
    "WIDE_STORE_URL", "postgresql+psycopg://postgres@127.0.0.1/celery_saga_bench_wide"
)
QUEUE = os.environ.get("WIDE_QUEUE", "celery_saga_wide")
WIDTHS = (10, 100, 500, 1000)

app = Celery("wide_runs", broker=BROKER_URL, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    saga_store_url=STORE_URL,
)
engine = SagaEngine(app)


def noop() -> None:
    return None


def _items(width: int) -> Callable[[object], list[int]]:
    return lambda _ctx: list(range(width))


for _width in WIDTHS:
    engine.register(
        Saga(f"group{_width}")
        .parallel("group", *(step(f"m{index}", noop) for index in range(_width)))
        .step("after", noop)
    )
    engine.register(
        Saga(f"each{_width}").for_each(_items(_width), step("item", noop), max_iterations=1000)
    )
engine.register(Saga("single").step("only", noop))


class LockSampler:
    """Counts backends of the store's database waiting on a lock, every 5 ms."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.samples = self.waiter_total = self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        observer = create_engine(STORE_URL, isolation_level="AUTOCOMMIT")
        query = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        with observer.connect() as connection:
            while not self._stop.is_set():
                waiting = int(connection.execute(query).scalar_one())
                self.samples += 1
                self.waiter_total += waiting
                self.most = max(self.most, waiting)
                time.sleep(0.005)
        observer.dispose()

    def __enter__(self) -> LockSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def summary(self) -> str:
        if not self.enabled:
            return ""
        # Each sample stands for about 5 ms plus the query's own time.
        return f"lock waiters max {self.most}, ~{self.waiter_total * 0.005:.2f} s waited"


def _wait_done(ids: Sequence[str], pause: float = 0.05, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    pending = list(ids)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"runs did not complete: {pending[:5]}")
        with engine.db.engine.connect() as connection:
            done = connection.execute(
                select(executions.c.id).where(
                    executions.c.id.in_(pending), executions.c.state == "completed"
                )
            ).scalars()
            pending = sorted(set(pending) - set(done))
        if pending:
            time.sleep(pause)


def _timestamps(ids: Sequence[str]) -> tuple[float, list[datetime]]:
    """The span from the first start to the last completion, and the completions in order."""
    with engine.db.engine.connect() as connection:
        rows = connection.execute(
            select(step_records.c.started_at, step_records.c.completed_at).where(
                step_records.c.execution_id.in_(list(ids))
            )
        ).all()
    start = min(r.started_at for r in rows)
    ends = sorted(r.completed_at for r in rows)
    return (ends[-1] - start).total_seconds(), ends


def _tenths(ends: list[datetime]) -> tuple[float, float]:
    """Median gap between consecutive completions in the first and the last tenth."""
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ends)]
    tenth = max(1, len(gaps) // 10)
    return statistics.median(gaps[:tenth]), statistics.median(gaps[-tenth:])


def _one_run(saga: str, pause: float = 0.05) -> list[str]:
    run = engine.start(saga, {})
    _wait_done([run.id], pause)
    return [run.id]


def _singles_at_once(count: int) -> list[str]:
    # Started from 8 threads, so the driver's own pace does not bound the span.
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: engine.start("single", {}).id, range(count)))
    _wait_done(ids)
    return ids


def _singles_in_turn(count: int) -> list[str]:
    # Polled every millisecond: the next run starts as soon as the previous one completed.
    return [_one_run("single", 0.001)[0] for _ in range(count)]


SIDES: dict[str, Callable[[int], list[str]]] = {
    "one-step runs in turn": _singles_in_turn,
    "for_each": lambda width: _one_run(f"each{width}"),
    "one-step runs at once": _singles_at_once,
    "parallel group": lambda width: _one_run(f"group{width}"),
}
#: The side each wide run is compared with.
BASELINE = {"for_each": "one-step runs in turn", "parallel group": "one-step runs at once"}


def measure(side: str, width: int, rounds: int, locks: bool) -> dict[str, float | str]:
    spans, firsts, lasts, summary = [], [], [], ""
    for _ in range(rounds):
        with LockSampler(locks) as sampler:
            ids = SIDES[side](width)
        span, ends = _timestamps(ids)
        first, last = _tenths(ends)
        spans.append(span)
        firsts.append(first)
        lasts.append(last)
        summary = sampler.summary()
        _vacuum()
    return {
        "span": statistics.median(spans),
        "first": statistics.median(firsts),
        "last": statistics.median(lasts),
        "locks": summary,
    }


def _vacuum() -> None:
    # The database may run without autovacuum; the rounds after it would read dead rows.
    with create_engine(STORE_URL, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f"VACUUM ANALYZE {', '.join(metadata.tables)}"))


def _spawn_workers(count: int) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "celery", "-A", "benchmarks.wide_runs", "worker"]
    command += ["-P", "prefork", "-c", "2", "--prefetch-multiplier", "1", "-Q", QUEUE]
    command += ["--without-gossip", "--without-mingle", "-l", "WARNING"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen([*command, "-n", f"wide{n}-{uuid.uuid4().hex[:6]}@%h"], env=env, cwd=ROOT)
        for n in range(count)
    ]
    deadline = time.monotonic() + 60
    while len(app.control.ping(timeout=1.0) or []) < count:
        if time.monotonic() > deadline:
            raise SystemExit("workers did not answer ping")
    return workers


def _row(side: str, width: int, result: dict[str, float | str], base: float | None) -> str:
    span, first, last = (float(result[k]) for k in ("span", "first", "last"))
    ratio = f"{span / base:.2f}x" if base else ""
    return (
        f"| {side} | {width} | {span * 1000:.0f} | {ratio} | {first * 1000:.2f}"
        f" | {last * 1000:.2f} | {last / first if first else 0:.2f} | {result['locks']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument("--locks", action="store_true", help="sample lock waits")
    options = parser.parse_args()
    engine.ensure_schema()
    with engine.db.transaction() as connection:
        connection.execute(text(f"TRUNCATE {', '.join(metadata.tables)}"))
    workers = _spawn_workers(2)
    print(
        "| side | width | span ms | vs one-step | first tenth ms/item | last tenth ms/item"
        " | last/first | locks |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    try:
        for width in options.widths:
            bases: dict[str, float] = {}
            for side in options.sides:
                result = measure(side, width, options.rounds, options.locks)
                bases[side] = float(result["span"])
                paired = bases.get(BASELINE.get(side, ""))
                print(_row(side, width, result, paired), flush=True)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
        engine.db.dispose()


if __name__ == "__main__":
    main()
