"""A wide parallel group joining on one run row, with real prefork workers.

Every member of a parallel group settles in a transaction that locks the run row and reads
the group's records, so the members of one run settle one at a time. This measures what
that costs: for groups of ``--widths`` members (one run each, ``--rounds`` times), the wall
time from the first member's start to the step after the group, against the same number of
one-step runs that share no row; and, sampled from ``pg_stat_activity`` every 5 ms, how many
backends waited on a lock and for how long in total.

    python -m benchmarks.join_contention --widths 10 100 --rounds 3

The module is also the workers' Celery app (``-A benchmarks.join_contention``). Environment:
``JOIN_BROKER_URL`` (RabbitMQ by default), ``JOIN_STORE_URL`` (a PostgreSQL database that
the run empties of saga rows).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from celery import Celery
from sqlalchemy import create_engine, select, text

from celery_saga import Saga, SagaEngine, step
from celery_saga.store.tables import metadata, step_records

BROKER_URL = os.environ.get("JOIN_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
STORE_URL = os.environ.get("JOIN_STORE_URL", "postgresql+psycopg://postgres@127.0.0.1/test")
QUEUE = os.environ.get("JOIN_QUEUE", "celery_saga_join")
WIDTHS = (10, 100)
ROOT = Path(__file__).resolve().parent.parent

app = Celery("join_contention", broker=BROKER_URL, set_as_current=False)
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


for _width in WIDTHS:
    engine.register(
        Saga(f"wide{_width}")
        .parallel("group", *(step(f"m{index}", noop) for index in range(_width)))
        .step("after", noop)
    )
engine.register(Saga("single").step("only", noop))


class LockSampler:
    """Counts backends of the store's database waiting on a lock, every 5 ms."""

    def __init__(self) -> None:
        self.samples = self.waiting_samples = self.waiter_total = self.most = 0
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
                self.waiting_samples += waiting > 0
                self.waiter_total += waiting
                self.most = max(self.most, waiting)
                time.sleep(0.005)
        observer.dispose()

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        # Each sample stands for about 5 ms plus the query's own time.
        waited = self.waiter_total * 0.005
        return f"lock waiters: max {self.most}, ~{waited:.2f} s of backend lock wait in total"


def _wait_done(ids: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(engine.get(i).state.value == "completed" for i in ids):
            return
        time.sleep(0.05)
    raise SystemExit(f"runs did not complete: {ids}")


def _span(ids: list[str], first: set[str], last: set[str]) -> float:
    """Seconds from the earliest start among ``first`` steps to the latest completion among
    ``last`` steps (worker timestamps, one host)."""
    with engine.db.engine.connect() as connection:
        rows = connection.execute(
            select(
                step_records.c.name, step_records.c.started_at, step_records.c.completed_at
            ).where(step_records.c.execution_id.in_(ids))
        ).all()
    start = min(r.started_at for r in rows if r.name in first)
    end = max(r.completed_at for r in rows if r.name in last)
    return float((end - start).total_seconds())


def measure_group(width: int) -> tuple[float, str]:
    with LockSampler() as sampler:
        run = engine.start(f"wide{width}", {})
        _wait_done([run.id])
    members = {f"m{index}" for index in range(width)}
    return _span([run.id], members, {"after"}), sampler.summary()


def measure_singles(count: int) -> tuple[float, str]:
    with LockSampler() as sampler:
        # Started from 8 threads, so the driver's own pace does not bound the span.
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda _: engine.start("single", {}).id, range(count)))
        _wait_done(ids)
    return _span(ids, {"only"}, {"only"}), sampler.summary()


def _spawn_workers(count: int) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "celery", "-A", "benchmarks.join_contention", "worker"]
    command += ["-P", "prefork", "-c", "2", "--prefetch-multiplier", "1", "-Q", QUEUE]
    command += ["--without-gossip", "--without-mingle", "-l", "WARNING"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen([*command, "-n", f"join{n}-{uuid.uuid4().hex[:6]}@%h"], env=env, cwd=ROOT)
        for n in range(count)
    ]
    deadline = time.monotonic() + 60
    while len(app.control.ping(timeout=1.0) or []) < count:
        if time.monotonic() > deadline:
            raise SystemExit("workers did not answer ping")
    return workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    engine.ensure_schema()
    with engine.db.transaction() as connection:
        connection.execute(text(f"TRUNCATE {', '.join(metadata.tables)}"))
    workers = _spawn_workers(2)
    try:
        for width in options.widths:
            for label, measure in (
                ("group of", measure_group),
                ("single-step runs:", measure_singles),
            ):
                results = [measure(width) for _ in range(options.rounds)]
                spans = [span for span, _ in results]
                print(
                    f"{label} {width}: median {statistics.median(spans) * 1000:.0f} ms"
                    f" (rounds: {', '.join(f'{s * 1000:.0f}' for s in spans)});"
                    f" {results[-1][1]}"
                )
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
        engine.db.dispose()


if __name__ == "__main__":
    main()
