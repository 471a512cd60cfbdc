"""The hot path's statements sent straight to psycopg (``store/drivers/postgres.py``) against
the same statements run by SQLAlchemy, on the same store, the same connection, interleaved.

The psycopg strategy earns its place only with a gain SQLAlchemy cannot match; this script
is the measurement. Each of ``--count`` rounds takes one run per way through its hot path: the
run's INSERT, the snapshot read, the first claim of its step, the step-completed write
(the outcome and the cursor move in one statement) and, once the run is failed (not
measured), the lean reversal claim. The two ways alternate which goes first. Timed per
call: wall time and this process's CPU (``time.process_time``); printed: the median and
p95 per statement and way, and what the direct path saves at the median.

"SQLAlchemy" is the store with SQLAlchemy's strategy (``store/drivers/alchemy.py``) in place
of psycopg's: the statements built once are run by ``Connection.execute`` (the first claim
with its ``RETURNING``, as SQLAlchemy wants it on PostgreSQL), with the same connection,
pool and autocommit mode.

    BENCH_STORE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/direct_bench \\
        python benchmarks/direct_statements.py --count 3000

The database is created if missing; the script works in a schema of its own and drops it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from bench_infra import vacuum_tables
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from celery_saga.decisions.cursor import Advance
from celery_saga.records import Attempt, ExecutionState
from celery_saga.store import drivers, forward, queries, reversal
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

DEFAULT_STORE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/direct_bench"
LABELS = ("new run", "snapshot read", "step claim", "step completed", "reversal claim")
WAYS = ("direct", "sqlalchemy")
NOTHING = pack(None, what="an empty payload")
#: label -> way -> [(wall seconds, client CPU seconds), ...]
Samples = dict[str, dict[str, list[tuple[float, float]]]]


def now() -> datetime:
    return datetime.now(UTC)


@contextmanager
def sqlalchemy_runs_everything(db: Database) -> Iterator[None]:
    """The store with SQLAlchemy's strategy: every statement through ``Connection.execute``."""
    real = db.driver
    drivers.use(db.engine, drivers.ALCHEMY)
    try:
        yield
    finally:
        drivers.use(db.engine, real)


def ensure_database(url: str) -> None:
    parsed = make_url(url)
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        found = connection.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": parsed.database}
        ).first()
        if found is None:
            connection.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    admin.dispose()


class Store:
    """The saga store in a schema of its own, and one run's hot path through it."""

    def __init__(self, url: str) -> None:
        self.schema = f"direct_statements_{uuid.uuid4().hex[:8]}"
        self.admin = create_engine(url)
        with self.admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{self.schema}"'))
        scoped = make_url(url).update_query_dict({"options": f"-csearch_path={self.schema}"})
        self.scoped = create_engine(scoped)
        self.db = Database(scoped.render_as_string(hide_password=False))
        self.db.migrate()

    def drop(self) -> None:
        self.db.dispose()
        self.scoped.dispose()
        with self.admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{self.schema}" CASCADE'))
        self.admin.dispose()

    def vacuum(self) -> None:
        vacuum_tables(self.scoped, ("saga_executions", "saga_steps"))

    def one_run(self, timed: Callable[..., Any]) -> None:
        """One run's hot path, each statement through ``timed(label, call, *args)``."""
        run_id = uuid.uuid4().hex
        timed("new run", self.new_run, run_id)
        timed("snapshot read", queries.load_snapshot, self.db, run_id)
        timed("step claim", self.claim, run_id)
        timed("step completed", self.complete, run_id)
        plan = forward.fail_execution(
            self.db, execution_id=run_id, reason="bench", compensations={"a"}, now=now()
        )
        assert plan is not None, f"{run_id} could not be failed"
        timed("reversal claim", self.reversal_claim, run_id)

    def new_run(self, run_id: str) -> None:
        queries.create_execution(
            self.db,
            execution_id=run_id,
            saga_name="direct",
            definition_hash="h",
            input_blob=NOTHING,
            node=0,
            sub=0,
            state=ExecutionState.RUNNING,
            committed=False,
            now=now(),
        )

    def claim(self, run_id: str) -> None:
        attempt = forward.claim_step(
            self.db,
            execution_id=run_id,
            name="a",
            node=0,
            sub=0,
            definition_hash="h",
            idempotency_key=f"{run_id}:a",
            compensatable=True,
            lease_expires_at=now() + timedelta(minutes=5),
            now=now(),
            existing=None,
        )
        assert attempt == 1, f"claim of {run_id} refused"

    def complete(self, run_id: str) -> None:
        # The run stays live after its step, so that it can be failed and unwound.
        written = forward.record_step_completed(
            self.db,
            Attempt(run_id, "a", 0, 0, 1),
            result_blob=NOTHING,
            advance=Advance(1, 0, finished=False, passes_pivot=False),
            now=now(),
        )
        assert written, f"outcome of {run_id} refused"

    def reversal_claim(self, run_id: str) -> None:
        claimed = reversal.claim_next_reversal(
            self.db,
            Attempt.reversal(run_id, "a", 1),
            lease_expires_at=now() + timedelta(minutes=5),
            with_run=False,
        )
        assert claimed is not None, f"reversal claim of {run_id} refused"


def measure(store: Store, count: int, samples: Samples | None) -> None:
    """``count`` rounds, each one run per way, the way that goes first alternating."""

    def timed_as(way: str) -> Callable[..., Any]:
        def timed(label: str, call: Callable[..., Any], *args: Any) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            result = call(*args)
            took = (time.perf_counter() - wall, time.process_time() - cpu)
            if samples is not None:
                samples.setdefault(label, {}).setdefault(way, []).append(took)
            return result

        return timed

    # One connection for everything, as a worker's task holds one (``task_connection``).
    with store.db.task_connection():
        for index in range(count):
            for way in WAYS if index % 2 == 0 else reversed(WAYS):
                if way == "direct":
                    store.one_run(timed_as(way))
                else:
                    with sqlalchemy_runs_everything(store.db):
                        store.one_run(timed_as(way))


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def report(samples: Samples) -> None:
    print("ms per statement       way          wall med  wall p95   cpu med   cpu p95")
    for label in LABELS:
        medians = {}
        for way in WAYS:
            walls = [wall * 1000 for wall, _ in samples[label][way]]
            cpus = [cpu * 1000 for _, cpu in samples[label][way]]
            medians[way] = (statistics.median(walls), statistics.median(cpus))
            cells = (medians[way][0], p95(walls), medians[way][1], p95(cpus))
            print(f"  {label:20} {way:10} " + " ".join(f"{v:9.3f}" for v in cells))
        saved_wall = medians["sqlalchemy"][0] - medians["direct"][0]
        saved_cpu = medians["sqlalchemy"][1] - medians["direct"][1]
        share = saved_cpu / medians["sqlalchemy"][1] if medians["sqlalchemy"][1] else 0.0
        print(
            f"  {'':20} {'saved':10} {saved_wall:9.3f} {'':9} {saved_cpu:9.3f}"
            f"   ({share:.0%} of SQLAlchemy's client CPU)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=3000, help="rounds (one run per way each)")
    parser.add_argument("--warmup", type=int, default=200, help="rounds not measured")
    args = parser.parse_args()
    url = os.environ.get("BENCH_STORE_URL") or DEFAULT_STORE_URL
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() != "psycopg":
        raise SystemExit(f"BENCH_STORE_URL must be a postgresql+psycopg URL, got {url!r}")
    ensure_database(url)
    store = Store(url)
    try:
        measure(store, args.warmup, None)  # the caches, prepared statements and tables
        store.vacuum()
        samples: Samples = {}
        measure(store, args.count, samples)
    finally:
        store.drop()
    report(samples)


if __name__ == "__main__":
    main()
