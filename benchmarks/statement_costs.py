"""What each store write of the hot path costs, beside the chain task's one write.

``chain_vs_saga.py`` measures whole runs on a real worker, where the machine's noise moves
identical rounds by up to 2x. This script measures the writes alone, in one process against
one PostgreSQL backend, and splits each into its wall time, this process's CPU and the
backend's CPU (read from ``/proc``, so only for a server on this host):

- ``chain write``: what ``bench.write`` does (``engine.begin()``, one INSERT, COMMIT);
- ``new run``: ``engine.start()``'s INSERT of the run;
- ``forward claim`` and ``forward outcome``: a step's two statements;
- ``reversal claim`` (the lean one: the compensation takes no context) and
  ``reversal outcome``: a reversal's two statements.

``--count`` runs go through these in order, each run its whole life, once to fill the tables
(not measured), then ``--repeats`` times, each after a ``VACUUM ANALYZE`` of the tables; the
median repeat is printed, then a node's sum against the chain write.

    python benchmarks/statement_costs.py --count 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench_infra import WRITE_SQL, cpu_seconds_of, create_writes_table, vacuum_tables
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from celery_saga.decisions.cursor import Advance
from celery_saga.records import Attempt, CompensationOutcome, ExecutionState
from celery_saga.store import forward, queries, reversal
from celery_saga.store.codec import pack
from celery_saga.store.database import Database

DEFAULT_STORE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
WRITES = "statement_costs_writes"
STEPS = ("a", "b")
Measures = dict[str, tuple[float, float, float | None]]
NOTHING = pack(None, what="an empty payload")
CHAIN_WRITE = text(WRITE_SQL.format(table=WRITES))


def now() -> datetime:
    return datetime.now(UTC)


def backend_pid(connection: Any) -> int:
    return int(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


class Store:
    """The saga store and the chain's table in a schema of their own."""

    def __init__(self, url: str) -> None:
        self.schema = f"statement_costs_{uuid.uuid4().hex[:8]}"
        self.admin = create_engine(url)
        with self.admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{self.schema}"'))
        scoped = make_url(url).update_query_dict({"options": f"-csearch_path={self.schema}"})
        self.db = Database(scoped.render_as_string(hide_password=False))
        self.db.migrate()
        # The chain task's own engine and table, as in bench_app.py.
        self.chain = create_engine(scoped, pool_size=1)
        with self.chain.begin() as connection:
            create_writes_table(connection, WRITES)

    def drop(self) -> None:
        self.db.dispose()
        self.chain.dispose()
        with self.admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{self.schema}" CASCADE'))
        self.admin.dispose()

    def vacuum(self) -> None:
        """``VACUUM ANALYZE`` the tables, as autovacuum keeps doing on a live store. Without
        it (a server with autovacuum off), the plans a backend caches for the hot path are
        those of the tables as they were when first analyzed, or never: on tables analyzed
        when they held 50 runs, a reversal's claim then cost 1.5 ms of server CPU at 2,000
        runs, 0.2-0.3 ms after a new ``ANALYZE``."""
        vacuum_tables(self.chain, ("saga_executions", "saga_steps", WRITES))

    # -- the writes, one run id each ------------------------------------------------------
    def chain_write(self, run_id: str) -> None:
        with self.chain.begin() as connection:
            connection.execute(CHAIN_WRITE, {"r": run_id, "b": "costs", "s": 0})

    def new_run(self, run_id: str) -> None:
        queries.create_execution(
            self.db,
            execution_id=run_id,
            saga_name="costs",
            definition_hash="h",
            input_blob=NOTHING,
            node=0,
            sub=0,
            state=ExecutionState.RUNNING,
            committed=False,
            now=now(),
        )

    def claim(self, run_id: str, node: int) -> None:
        attempt = forward.claim_step(
            self.db,
            execution_id=run_id,
            name=STEPS[node],
            node=node,
            sub=0,
            definition_hash="h",
            idempotency_key=f"{run_id}:{node}",
            compensatable=True,
            lease_expires_at=now() + timedelta(minutes=5),
            now=now(),
            existing=None,
        )
        assert attempt == 1, f"claim of {run_id}/{node} refused"

    def outcome(self, run_id: str, node: int) -> None:
        # The run stays live after its last step here, so that it can be failed and unwound.
        advance = Advance(node + 1, 0, finished=False, passes_pivot=False)
        written = forward.record_step_completed(
            self.db,
            Attempt(run_id, STEPS[node], node, 0, 1),
            result_blob=NOTHING,
            advance=advance,
            now=now(),
        )
        assert written, f"outcome of {run_id}/{node} refused"

    def fail(self, run_id: str) -> None:
        plan = forward.fail_execution(
            self.db, execution_id=run_id, reason="costs", compensations=STEPS, now=now()
        )
        assert plan is not None, f"{run_id} could not be failed"

    def reversal_claim(self, run_id: str) -> reversal.Unwinding:
        unwinding = reversal.claim_next_reversal(
            self.db,
            Attempt.reversal(run_id, STEPS[-1], 1),
            lease_expires_at=now() + timedelta(minutes=5),
            with_run=False,
        )
        assert unwinding is not None, f"reversal claim of {run_id} refused"
        return unwinding

    def reversal_outcome(self, run_id: str, unwinding: reversal.Unwinding) -> None:
        plan = reversal.record_compensation(
            self.db,
            Attempt.reversal(run_id, STEPS[-1], 1),
            outcome=CompensationOutcome.COMPENSATED,
            reason=None,
            compensations=STEPS,
            now=now(),
            steps=unwinding.steps,
            committed=False,
        )
        assert plan is not None, f"reversal outcome of {run_id} refused"


class Meter:
    """Sums, per statement kind, wall time, this process's CPU and the backend's CPU (the
    backend's in clock ticks read around each call: summed over many calls, unbiased)."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}
        self.server_known = True

    def __call__(self, label: str, pid: int, call: Callable[..., Any], *args: Any) -> Any:
        server_before = cpu_seconds_of(pid)
        client_before, started = time.process_time(), time.perf_counter()
        result = call(*args)
        wall, client = time.perf_counter() - started, time.process_time() - client_before
        server_after = cpu_seconds_of(pid)
        if server_before is None or server_after is None:
            self.server_known = False
            server = 0.0
        else:
            server = server_after - server_before
        sums = self.sums.setdefault(label, [0.0, 0.0, 0.0, 0])
        for index, value in enumerate((wall, client, server, 1)):
            sums[index] += value
        return result

    def per_call(self) -> Measures:
        """ms per call of each kind: wall, client CPU, server CPU (None: not on this host)."""
        return {
            label: (
                wall * 1000 / count,
                client * 1000 / count,
                server * 1000 / count if self.server_known else None,
            )
            for label, (wall, client, server, count) in self.sums.items()
        }


LABELS = (
    "chain write",
    "new run",
    "forward claim",
    "forward outcome",
    "reversal claim",
    "reversal outcome",
)


def one_repeat(store: Store, count: int) -> Measures:
    """``count`` runs, each through its whole life in order (as a worker would take it):
    the chain's write, then a new run, its two steps, its failure (not measured) and the
    reversal of its last step. Row versions then land as they do on a worker (an update
    finds room on its page, PostgreSQL's HOT update), not as a batch per kind would."""
    meter = Meter()
    with store.db.single_statement() as connection:
        saga = backend_pid(connection)
    with store.chain.connect() as connection:
        chain = backend_pid(connection)
    for _ in range(count):
        run_id = uuid.uuid4().hex
        meter("chain write", chain, store.chain_write, run_id)
        meter("new run", saga, store.new_run, run_id)
        for node in range(len(STEPS)):
            meter("forward claim", saga, store.claim, run_id, node)
            meter("forward outcome", saga, store.outcome, run_id, node)
        store.fail(run_id)
        unwinding = meter("reversal claim", saga, store.reversal_claim, run_id)
        meter("reversal outcome", saga, store.reversal_outcome, run_id, unwinding)
    with store.db.single_statement() as connection:
        moved = backend_pid(connection) != saga
    if moved:
        raise RuntimeError("the store changed connections during the repeat")
    return meter.per_call()


def _median(repeats: list[Measures], label: str, index: int) -> float | None:
    values = [r[label][index] for r in repeats]
    return None if None in values else statistics.median(v for v in values if v is not None)


#: What a node costs: its two statements (and a fifth of the run's INSERT, for a step of a
#: 5-step saga).
NODES = (
    ("forward node", ("forward claim", "forward outcome"), 0.0),
    ("forward node + new run / 5", ("forward claim", "forward outcome"), 0.2),
    ("reversal", ("reversal claim", "reversal outcome"), 0.0),
)


def report(repeats: list[Measures]) -> None:
    print(f"{'ms per statement (median repeat)':34} {'wall':>7} {'client':>7} {'server':>7}")
    cells = {label: [_median(repeats, label, i) for i in range(3)] for label in LABELS}
    for label in LABELS:
        print(f"  {label:32} " + " ".join(_cell(v) for v in cells[label]))
    print("per node, and against the chain task's write (wall, client, server)")
    for node, (claim, outcome), share in NODES:
        sums = [
            _sum(_sum(a, b), None if run is None else run * share)
            for a, b, run in zip(cells[claim], cells[outcome], cells["new run"], strict=True)
        ]
        ratios = " ".join(_ratio(v, c) for v, c in zip(sums, cells["chain write"], strict=True))
        print(f"  {node:32} " + " ".join(_cell(v) for v in sums) + f"   {ratios}")


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _cell(value: float | None) -> str:
    return "      -" if value is None else f"{value:7.3f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=2000, help="statements of each kind")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("BENCH_STORE_URL") or DEFAULT_STORE_URL
    if make_url(url).get_backend_name() != "postgresql":
        raise SystemExit(f"BENCH_STORE_URL must be a PostgreSQL URL, got {url!r}")
    store = Store(url)
    try:
        one_repeat(store, args.count)  # warms the connections, the caches and the tables
        repeats = []
        for _ in range(args.repeats):
            store.vacuum()
            repeats.append(one_repeat(store, args.count))
    finally:
        store.drop()
    report(repeats)
    if repeats[0]["chain write"][2] is None:
        print("(server CPU: not shown, the server is not on this host)")


if __name__ == "__main__":
    main()
