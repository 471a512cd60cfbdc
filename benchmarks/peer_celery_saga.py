#!/usr/bin/env python
"""Benchmark of the peer ``celery-saga`` 0.1.1 (PyPI), in a virtualenv of its own.

Its import name is ``celery_saga``, like this project's, so it cannot share our venv:

    python3 -m venv .venv-peer
    .venv-peer/bin/pip install "celery-saga==0.1.1" redis
    .venv-peer/bin/python benchmarks/peer_celery_saga.py --broker both

What 0.1.1 provides: a saga is a Celery ``chain`` (start task, one ``run_step`` task per step
that calls the step task in-process with ``task.apply``, a ``complete`` task) with a
``link_error`` that starts a second ``chain`` of ``run_compensation`` tasks. Its state is a
JSON document per run in a backend: in memory (one process only) or Redis (the one used
here, so that this driver can see the runs end); nothing is written to PostgreSQL.

The same file is the driver and the worker's app (``celery -A peer_celery_saga worker``).
Measured, interleaved, on one worker like ``chain_vs_saga.py`` (prefork 2, prefetch 1, fair):
latency of one 5-step saga and of one failing saga (4 reversals), then ``--batch`` sagas and
``--unwinds`` failing sagas in flight per round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_infra import cpu_means, cpu_ms_per, process_cpu_seconds
from celery import Celery
from celery_saga.backends.redis import RedisSagaBackend

from celery_saga import Saga, set_default_backend

HERE = Path(__file__).resolve().parent
BROKERS = {
    "rabbitmq": ("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": ("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
STATE_URL = os.environ.get("PEER_STATE_URL") or "redis://127.0.0.1:6379/0"
QUEUE = os.environ.get("PEER_QUEUE") or "celery_saga_peer"
TERMINAL = ("completed", "compensated", "failed")


class RunBackend(RedisSagaBackend):
    PREFIX = f"{QUEUE}:"  # this run's keys only


app = Celery("peer_celery_saga")
app.conf.update(
    broker_url=os.environ.get("PEER_BROKER_URL") or BROKERS["rabbitmq"][1],
    result_backend=None,
    task_ignore_result=True,
    task_default_queue=QUEUE,  # also the compensation chain, which names no queue
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
)
backend = RunBackend(url=STATE_URL, ttl=3600)
set_default_backend(backend)


@app.task(name="peer.noop")
def noop(**_context: object) -> None:
    return None


@app.task(name="peer.undo")
def undo(_compensation_data: object = None) -> None:
    return None


@app.task(name="peer.fail")
def fail(**_context: object) -> None:
    raise RuntimeError("peer bench: the last step fails on purpose")


five = Saga("peer_five")
for _ in range(5):
    five.add_step(noop)
unwind = Saga("peer_unwind")
for _ in range(4):
    unwind.add_step(noop, compensate=undo)
unwind.add_step(fail)
SAGAS = {"saga": (five, "completed"), "unwind": (unwind, "compensated")}


def statuses(ids: list[str]) -> list[str | None]:
    raw = backend._client.mget([backend._key(i) for i in ids])
    return [None if r is None else json.loads(r)["status"] for r in raw]


def wait_all(ids: list[str], timeout: float, poll: float) -> list[str | None]:
    deadline = time.monotonic() + timeout
    while True:
        found = statuses(ids)
        if all(s in TERMINAL for s in found):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sum(s in TERMINAL for s in found)}/{len(ids)} settled")
        time.sleep(poll)


def run_batch(kind: str, count: int, timeout: float, poll: float) -> float:
    """Submit ``count`` runs at once; seconds until all settled (checked)."""
    saga, expected = SAGAS[kind]
    started = time.perf_counter()
    ids = [saga.run(queue=QUEUE).saga_id for _ in range(count)]
    found = wait_all(ids, timeout, poll)
    elapsed = time.perf_counter() - started
    wrong = [s for s in found if s != expected]
    if wrong:
        raise RuntimeError(f"{kind}: {len(wrong)} runs ended {set(wrong)}, expected {expected}")
    return elapsed


class Worker:
    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="peer-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None
        self.nodename = f"peer-{QUEUE[-8:]}@localhost"

    def start(self) -> None:
        command = [
            *(sys.executable, "-m", "celery", "-A", "peer_celery_saga", "worker"),
            *("--pool", "prefork", "--concurrency", "2", "--prefetch-multiplier", "1"),
            *("-O", "fair", "-Q", QUEUE, "-n", self.nodename, "--loglevel", "WARNING"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        self.proc = subprocess.Popen(
            command, cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        for _ in range(150):
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{Path(self.log.name).read_text()[-3000:]}")
            if app.control.ping(destination=[self.nodename], timeout=0.5):
                return
        raise RuntimeError("worker not ready")

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def measure(args: argparse.Namespace, worker_pid: int) -> dict[str, object]:
    latency: dict[str, list[float]] = {"saga": [], "unwind": []}
    rounds: dict[str, list[float]] = {"saga": [], "unwind": []}
    cpu: dict[str, list[dict[str, float]]] = {"saga": [], "unwind": []}
    for kind in SAGAS:  # warm-up
        run_batch(kind, 20, args.batch_timeout, args.batch_poll)
    for _ in range(args.samples):
        for kind in SAGAS:
            latency[kind].append(run_batch(kind, 1, 30, args.poll) * 1000)
    for _ in range(args.rounds):
        for kind in SAGAS:
            count = args.batch if kind == "saga" else args.unwinds
            before = process_cpu_seconds(worker_pid)
            rounds[kind].append(count / run_batch(kind, count, args.batch_timeout, args.batch_poll))
            cpu[kind].append(cpu_ms_per(before, process_cpu_seconds(worker_pid), count))
            print(f"  round {kind:<6}: {rounds[kind][-1]:.1f} runs/s", flush=True)
    return {"latency": latency, "runs_per_s": rounds, "cpu_per_run": cpu}


def report(broker: str, result: dict[str, dict[str, list[float]]]) -> None:
    print(f"\n== celery-saga 0.1.1 on {broker}")
    for kind in SAGAS:
        values = result["latency"][kind]
        p95 = statistics.quantiles(values, n=20, method="inclusive")[-1]
        runs = statistics.median(result["runs_per_s"][kind])
        print(
            f"  {kind:<6} latency median {statistics.median(values):7.1f} ms  p95 {p95:7.1f} ms"
            f"   {runs:7.1f} runs/s ({runs * 5:.1f} steps/s)"
        )
    print(f"  unwinds/s: {statistics.median(result['runs_per_s']['unwind']):.1f}")
    # The broker's group is redis-server or RabbitMQ; on Redis it also holds the peer's state.
    print("  CPU ms per run in the rounds (mean; the servers' other load included):")
    for kind in SAGAS:
        print(f"    {kind:<6} {cpu_means(result['cpu_per_run'][kind])}")


def purge() -> None:
    from kombu import Exchange, Queue

    with contextlib.suppress(Exception), app.connection_for_write() as connection:
        channel = connection.channel()
        queue = Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE)(channel)
        queue.purge()
        queue.delete()
        queue.exchange.delete()
        channel.close()
    keys = list(backend._client.scan_iter(match=f"{RunBackend.PREFIX}*", count=1000))
    for start in range(0, len(keys), 1000):
        backend._client.delete(*keys[start : start + 1000])


def run_one(args: argparse.Namespace) -> int:
    worker = Worker()
    try:
        worker.start()
        assert worker.proc is not None
        result = measure(args, worker.proc.pid)
        report(args.broker, result)
        return 0
    finally:
        worker.stop()
        purge()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--broker", choices=("rabbitmq", "redis", "both"), default="rabbitmq")
    add("--samples", type=int, default=30, help="latency samples per kind")
    add("--batch", type=int, default=500, help="sagas in flight per round")
    add("--unwinds", type=int, default=200, help="failing sagas in flight per round")
    add("--rounds", type=int, default=2)
    add("--poll", type=float, default=0.005)
    add("--batch-poll", type=float, default=0.02)
    add("--batch-timeout", type=float, default=180.0)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if "PEER_QUEUE" not in os.environ:  # the driver: one child per broker, own names
        code = 0
        for broker in ("rabbitmq", "redis") if args.broker == "both" else (args.broker,):
            variable, default = BROKERS[broker]
            env = {
                **os.environ,
                "PEER_QUEUE": f"celery_saga_peer_{uuid.uuid4().hex[:10]}",
                "PEER_BROKER_URL": os.environ.get(variable) or default,
            }
            argv = [a for a in sys.argv[1:] if a not in ("both", "rabbitmq", "redis")]
            argv = [a for a in argv if a != "--broker"] + ["--broker", broker]
            code = code or subprocess.call([sys.executable, __file__, *argv], env=env)
        return code
    return run_one(args)


if __name__ == "__main__":
    sys.exit(main())
