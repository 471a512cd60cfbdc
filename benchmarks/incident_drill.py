"""Issue 42's incident drill at full size, on real prefork workers, PostgreSQL and RabbitMQ
or Redis (each scenario in a fresh database, dropped after).

``outage``: ``--runs`` checkouts (``drill_app.py``: five steps, ``charge`` calls a local
HTTP payment provider that keeps a ledger by idempotency key) are started at ``--rate``;
``--outage-after`` seconds in, the provider stops (connection refused) for ``--outage``
seconds. Once every run has settled, the operator acts as a real CLI process: with policy
``hold``, ``celery saga retry --where saga=... --where state=held --yes --rate ...``; with
``unwind``, ``celery saga resume`` of the unwinds whose refund parked while the provider
was down. Printed: completed, unwound, held before the retry, charges per key.

``store-outage``: ``--held-runs`` runs held at ``charge`` (its provider down), then the
provider is back and the CLI bulk-retries them at ``--bulk-rate``; once ``--cut-at`` of
them are retried, the store (a cuttable TCP proxy in front of PostgreSQL, which the
workers and the CLI go through) is cut for ``--store-outage`` seconds. Printed: whether
the one CLI run finished, history rows per run naming the operation, charges per key.

    python benchmarks/incident_drill.py --scenario outage --broker both
    python benchmarks/incident_drill.py --scenario store-outage --broker both
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for folder in (str(HERE), str(ROOT)):
    if folder not in sys.path:
        sys.path.insert(0, folder)

from drill_app import make  # noqa: E402
from hold_outage import Provider, _states, _wait_settled  # noqa: E402

BROKERS = {
    "rabbitmq": ("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": ("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
ENDED = {"completed", "failed"}
#: The operator's move once the provider is back, and the state of the runs it acts on.
MOVES = {"hold": ("retry", "held"), "unwind": ("resume", "compensation_stuck")}
DEFAULT_STORE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A database of its own on ``admin_url``'s server, dropped after use."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"incident_drill_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Rig:
    """Workers and a beat of ``drill_app`` under ``env``; the driver's own engine reads
    the store at ``direct`` (not through a proxy)."""

    def __init__(self, env: dict[str, str], direct: str, workers: int, concurrency: int) -> None:
        self.env = {**os.environ, **env, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"}
        self.app, self.engine, self.saga = make({**env, "DRILL_STORE": direct})
        self.engine.ensure_schema()
        self.logs = Path(tempfile.mkdtemp(prefix="incident-drill-"))
        queue = env["DRILL_QUEUE"]
        self.processes = [self._spawn("beat", "-s", str(self.logs / "schedule"))]
        for index in range(workers):
            self.processes.append(
                self._spawn(
                    "worker",
                    "-P",
                    "prefork",
                    "-c",
                    str(concurrency),
                    "-Q",
                    queue,
                    "-n",
                    f"drill{index}-{queue}@%h",
                    "--prefetch-multiplier",
                    "1",
                    "--without-gossip",
                    "--without-mingle",
                )
            )
        self._wait_ready(queue, workers)

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{args[0]}{len(self.__dict__.get('processes', []))}.log", "wb")  # noqa: SIM115
        command = [sys.executable, "-m", "celery", "-A", "drill_app:app", *args, "-l", "WARNING"]
        return subprocess.Popen(
            command,
            cwd=HERE,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_ready(self, queue: str, count: int) -> None:
        ends = time.monotonic() + 90
        while time.monotonic() < ends:
            replies = self.app.control.ping(timeout=1.0) or []
            if sum(queue in name for reply in replies for name in reply) >= count:
                return
        raise SystemExit(f"workers not ready; logs in {self.logs}")

    def cli(self, *args: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "celery", "-A", "drill_app:app", "saga", *args]
        return subprocess.Popen(
            command,
            cwd=HERE,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        with self.app.connection_for_write() as connection:
            connection.default_channel.queue_delete(self.env["DRILL_QUEUE"])
        self.engine.db.engine.dispose()


def _env(
    broker: str, store: str, provider: Provider, policy: str, retry: int, backoff: float
) -> dict[str, str]:
    variable, default = BROKERS[broker]
    return {
        "DRILL_BROKER": os.environ.get(variable) or default,
        "DRILL_STORE": store,
        "DRILL_QUEUE": f"incident-drill-{uuid.uuid4().hex[:10]}",
        "DRILL_PROVIDER": f"http://127.0.0.1:{provider.port}",
        "DRILL_POLICY": policy,
        "DRILL_RETRY": str(retry),
        "DRILL_BACKOFF": str(backoff),
    }


def _operated(rig: Rig, move: str, state: str, rate: float) -> tuple[str, float]:
    """The operator's bulk move on every run of the drill's saga in ``state``, as a CLI
    process; its last line and how long it took."""
    began = time.monotonic()
    where = ["--where", f"saga={rig.saga}", "--where", f"state={state}"]
    done = rig.cli(move, *where, "--yes", "--rate", f"{rate:g}/s")
    output, _ = done.communicate(timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"celery saga {move} failed:\n{output}")
    return output.strip().splitlines()[-1], time.monotonic() - began


def outage(args: argparse.Namespace, broker: str, policy: str, admin: str) -> dict[str, Any]:
    provider = Provider()
    with fresh_database(admin) as store:
        rig = Rig(
            _env(broker, store, provider, policy, args.retry, args.backoff),
            store,
            args.workers,
            args.concurrency,
        )
        try:
            began = time.monotonic()
            down_at, stopped = began + args.outage_after, False
            for index in range(args.runs):
                if not stopped and time.monotonic() >= down_at:
                    provider.stop()
                    stopped = True
                time.sleep(max(0.0, began + index / args.rate - time.monotonic()))
                rig.engine.start(rig.saga, {"order": index})
            if not stopped:
                time.sleep(max(0.0, down_at - time.monotonic()))
                provider.stop()
            time.sleep(max(0.0, down_at + args.outage - time.monotonic()))
            provider.start()
            settled = ENDED | {"held", "compensation_stuck"}
            _wait_settled(rig.engine, rig.saga, args.runs, settled, args.settle_budget)
            before = _states(rig.engine, rig.saga)
            move, state = (
                ("retry", "held") if policy == "hold" else ("resume", "compensation_stuck")
            )
            said, took = ("", 0.0)
            if before[state]:
                said, took = _operated(rig, move, state, args.bulk_rate)
            _wait_settled(rig.engine, rig.saga, args.runs, ENDED, args.settle_budget)
            final = _states(rig.engine, rig.saga)
        finally:
            rig.close()
    return {
        "scenario": "outage",
        "broker": broker,
        "policy": policy,
        "runs": args.runs,
        "outage_s": args.outage,
        "held_before_operator": before["held"],
        "parked_before_operator": before["compensation_stuck"],
        "operator": f"celery saga {move}" if before[state] else "nothing to do",
        "operator_said": said,
        "operator_s": round(took, 1),
        "completed": final["completed"],
        "unwound": final["failed"],
        "charges_total": sum(provider.charges.values()),
        "most_charges_per_key": max(provider.charges.values(), default=0),
        "refunds": sum(provider.refunds.values()),
        "wall_s": round(time.monotonic() - began, 1),
    }


def _retried_rows(rig: Rig) -> list[Any]:
    from sqlalchemy import select

    from celery_saga.store.history import Kind
    from celery_saga.store.tables import history

    query = select(history.c.execution_id, history.c.actor).where(
        history.c.kind == Kind.HOLD_RETRIED.value
    )
    return list(rig.engine.db.read(query))


def store_outage(args: argparse.Namespace, broker: str, admin: str) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    from tests.faults import proxy

    provider = Provider()
    provider.stop()
    with fresh_database(admin) as direct, proxy(make_url(direct).port or 5432) as cut:
        through = make_url(direct).set(port=cut.port).render_as_string(hide_password=False)
        rig = Rig(
            _env(broker, through, provider, "hold", 1, 0.05), direct, args.workers, args.concurrency
        )
        try:
            runs = args.held_runs
            for index in range(runs):
                rig.engine.start(rig.saga, {"order": index})
            _wait_settled(rig.engine, rig.saga, runs, {"held"}, args.settle_budget)
            provider.start()
            began = time.monotonic()
            where = ["--where", f"saga={rig.saga}", "--where", "state=held"]
            cli = rig.cli("retry", *where, "--yes", "--rate", f"{args.bulk_rate:g}/s")
            at = max(1, int(runs * args.cut_at))
            while len(_retried_rows(rig)) < at and cli.poll() is None:
                time.sleep(0.1)
            cut_while_running = cli.poll() is None
            cut.cut(args.store_outage)
            output, _ = cli.communicate(timeout=args.settle_budget)
            cli_s = time.monotonic() - began
            _wait_settled(rig.engine, rig.saga, runs, ENDED, args.settle_budget)
            final, rows = _states(rig.engine, rig.saga), _retried_rows(rig)
        finally:
            rig.close()
    found = re.search(r"bulk retry (bulk-\w+) finished: .*", output)
    operation = found.group(1) if found else "?"
    mark = f"(bulk {operation})"
    per_run = Counter(r["execution_id"] for r in rows if r["actor"].endswith(mark))
    return {
        "scenario": "store-outage",
        "broker": broker,
        "held_runs": runs,
        "store_outage_s": args.store_outage,
        "cut_after_retried": at,
        "cut_while_cli_ran": cut_while_running,
        "cli_exit": cli.returncode,
        "cli_said": found.group(0) if found else output[-500:],
        "cli_s": round(cli_s, 1),
        "completed": final["completed"],
        "unwound": final["failed"],
        "runs_with_one_retry_row": sum(n == 1 for n in per_run.values()),
        "most_retry_rows_per_run": max(
            Counter(r["execution_id"] for r in rows).values(), default=0
        ),
        "charges_total": sum(provider.charges.values()),
        "most_charges_per_key": max(provider.charges.values(), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--scenario", choices=("outage", "store-outage", "both"), default="both")
    add("--broker", choices=("rabbitmq", "redis", "both"), default="both")
    add("--policy", choices=("hold", "unwind", "both"), default="both")
    add("--runs", type=int, default=500)
    add("--rate", type=float, default=10.0, help="runs started per second")
    add("--outage", type=float, default=60.0, help="seconds the provider is down")
    add("--outage-after", type=float, default=10.0, help="seconds after the first start")
    add("--retry", type=int, default=3, help="charge's attempts")
    add("--backoff", type=float, default=0.5)
    add("--held-runs", type=int, default=1000)
    add("--store-outage", type=float, default=30.0, help="seconds the store is cut")
    add("--cut-at", type=float, default=0.3, help="share of runs retried when it is cut")
    add("--bulk-rate", type=float, default=100.0, help="the CLI's --rate, runs per second")
    add("--workers", type=int, default=2)
    add("--concurrency", type=int, default=4)
    add("--store", default=os.environ.get("BENCH_STORE_URL", DEFAULT_STORE))
    add("--settle-budget", type=float, default=900.0)
    args = parser.parse_args()
    # A stopped drill still stops its workers and drops its database.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    brokers = list(BROKERS) if args.broker == "both" else [args.broker]
    policies = ("hold", "unwind") if args.policy == "both" else (args.policy,)
    for name in brokers:
        if args.scenario in ("outage", "both"):
            for policy in policies:
                print(json.dumps(outage(args, name, policy, args.store)), flush=True)
        if args.scenario in ("store-outage", "both"):
            print(json.dumps(store_outage(args, name, args.store)), flush=True)


if __name__ == "__main__":
    main()
