#!/usr/bin/env python
"""Benchmark: a plain 5-task ``celery.chain`` against a 5-step saga on the same worker.

One run of this script:

1. creates a private PostgreSQL schema and a private RabbitMQ queue (unique names),
2. starts ONE real ``celery worker`` subprocess (prefork, concurrency 2, prefetch 1,
   ``-O fair``, no events) that imports ``bench_app`` (beside this file),
3. warms up, then measures, alternating chain (A) and saga (B):
   - latency: end-to-end time of one run, ``--samples`` pairs, A B A B ...
   - throughput: ``--batch`` runs submitted at once, wall time until all finished,
     ``--rounds`` rounds, A B A B ...
4. prints medians/spread, steps per second and the saga/chain ratios next to the targets,
5. stops the worker (SIGTERM, then SIGKILL), purges and deletes its queue and exchange and
   drops its schema -- also on errors and Ctrl-C.

Run ``python benchmarks/chain_vs_saga.py --help`` for the knobs; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LATENCY_TARGET = 1.3  # saga latency <= 1.3 x chain latency
THROUGHPUT_TARGET = 0.8  # saga throughput >= 0.8 x chain throughput
DONE_STATES = ("completed", "failed", "compensation_stuck")


class BenchError(RuntimeError):
    pass


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="latency samples per side")
    parser.add_argument("--batch", type=int, default=500, help="runs in flight per round")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds per side")
    parser.add_argument("--poll", type=float, default=0.005,
                        help="completion poll interval for one latency sample (s)")
    parser.add_argument("--batch-poll", type=float, default=0.02,
                        help="completion poll interval for a throughput round (s)")
    parser.add_argument("--run-timeout", type=float, default=30.0,
                        help="give up on one latency sample after this many seconds")
    parser.add_argument("--batch-timeout", type=float, default=120.0,
                        help="give up on one throughput round after this many seconds")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="abort the whole benchmark after this many seconds")
    parser.add_argument("--profile", action="store_true",
                        help="instrument the worker (bench_profile.py) and print where each "
                             "task's time goes; adds a little overhead")
    parser.add_argument("--keep", action="store_true",
                        help="keep the schema (and the worker log) for inspection")
    return parser.parse_args()


# --- environment set-up before bench_app is imported -------------------------------------
def _configure_environment(run_id: str, profile: bool) -> None:
    os.environ.setdefault("BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    os.environ.setdefault("BENCH_STORE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    os.environ["BENCH_SCHEMA"] = f"celery_saga_bench_{run_id}"
    os.environ["BENCH_QUEUE"] = f"celery_saga_bench_{run_id}"
    os.environ["BENCH_PROFILE"] = "1" if profile else "0"
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def check(self, what: str) -> None:
        if time.monotonic() > self.end:
            raise BenchError(f"benchmark exceeded --max-seconds={self.seconds:g} during {what}")


# --- database ------------------------------------------------------------------------------
def _prepare_database(bench: Any) -> None:
    from sqlalchemy import text

    with bench.bench_db().begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{bench.SCHEMA}"'))
        connection.execute(text(
            f"CREATE TABLE {bench.WRITES_TABLE} (id BIGSERIAL PRIMARY KEY, "
            "run_id VARCHAR(64) NOT NULL, batch VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, "
            "written_at TIMESTAMPTZ NOT NULL DEFAULT now())"))
        for name, columns in (("ix_bench_run", "run_id, seq"), ("ix_bench_batch", "batch, seq")):
            connection.execute(text(f"CREATE INDEX {name} ON {bench.WRITES_TABLE} ({columns})"))
        if bench.PROFILE:
            import bench_profile

            connection.execute(text(bench_profile.CREATE_TABLE))
    bench.engine.ensure_schema()  # saga store tables, inside the same private schema


def _drop_schema(bench: Any) -> None:
    from sqlalchemy import text

    with bench.bench_db().begin() as connection:
        connection.execute(text(f'DROP SCHEMA IF EXISTS "{bench.SCHEMA}" CASCADE'))


def _scalar(bench: Any, sql: str, **params: Any) -> Any:
    from sqlalchemy import text

    with bench.bench_db().connect() as connection:
        return connection.execute(text(sql), params).scalar()


# --- worker --------------------------------------------------------------------------------
class Worker:
    def __init__(self, bench: Any, run_id: str) -> None:
        self.bench = bench
        self.nodename = f"bench-{run_id}@localhost"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="celery-saga-bench-worker-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def start(self, ready_timeout: float = 60.0) -> None:
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        command = [
            sys.executable, "-m", "celery", "-A", "bench_app", "worker",
            "--pool", "prefork", "--concurrency", "2", "--prefetch-multiplier", "1",
            "-O", "fair", "-Q", self.bench.QUEUE, "-n", self.nodename,
            "--loglevel", os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING"),
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        self.proc = subprocess.Popen(command, cwd=HERE, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"worker exited with {self.proc.returncode}:\n{self.tail()}")
            replies = self.bench.app.control.ping(destination=[self.nodename], timeout=0.5)
            if any(self.nodename in reply for reply in replies):
                return
            time.sleep(0.2)
        raise BenchError(f"worker not ready after {ready_timeout:g}s:\n{self.tail()}")

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"worker died:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no worker log)"

    def stop(self, keep_log: bool = False) -> None:
        if self.stopped:
            return
        self.stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # warm shutdown of the worker and its pool
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: worker + children
                proc.wait(timeout=10)
        if proc is not None:
            # Pool children left behind by a worker that died on its own.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.log.close()
        if keep_log:
            print(f"worker log kept: {self.log.name}")
        else:
            with contextlib.suppress(OSError):
                os.unlink(self.log.name)


def _purge_queue(bench: Any) -> int:
    from kombu import Exchange, Queue

    with bench.app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=3)
        channel = connection.channel()
        try:
            queue = Queue(bench.QUEUE, Exchange(bench.QUEUE), routing_key=bench.QUEUE)(channel)
            purged = queue.purge() or 0
            queue.delete()
            queue.exchange.delete()
            return int(purged)
        finally:
            channel.close()


# --- the two workloads ---------------------------------------------------------------------
def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float,
                what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise BenchError(f"{what} did not finish within {timeout:g}s")
        time.sleep(interval)


class ChainSide:
    label = "chain"

    def __init__(self, bench: Any, poll: float) -> None:
        self.bench, self.poll = bench, poll
        self.submit_times: list[float] = []
        self.marker_sql = (f"SELECT count(*) FROM {bench.WRITES_TABLE} "
                           f"WHERE run_id = :r AND seq = {bench.STEPS_PER_RUN - 1}")
        self.batch_sql = (f"SELECT count(*) FROM {bench.WRITES_TABLE} "
                          f"WHERE batch = :b AND seq = {bench.STEPS_PER_RUN - 1}")

    def one(self, timeout: float) -> float:
        run_id, bench = uuid.uuid4().hex, self.bench
        started = time.perf_counter()
        bench.chain_signature(run_id, "latency").apply_async()
        self.submit_times.append(time.perf_counter() - started)
        _wait_until(lambda: _scalar(bench, self.marker_sql, r=run_id) > 0, timeout, self.poll,
                    f"chain {run_id}")
        return time.perf_counter() - started

    def submit(self, batch: str, count: int) -> None:
        for index in range(count):
            self.bench.chain_signature(f"{batch}-{index}", batch).apply_async()

    def finished(self, batch: str) -> int:
        return int(_scalar(self.bench, self.batch_sql, b=batch))

    def verify(self, batch: str, count: int) -> None:
        rows = _scalar(self.bench, f"SELECT count(*) FROM {self.bench.WRITES_TABLE} "
                                   "WHERE batch = :b", b=batch)
        if rows != count * self.bench.STEPS_PER_RUN:
            raise BenchError(f"chain batch {batch}: {rows} writes, expected "
                             f"{count * self.bench.STEPS_PER_RUN}")


class SagaSide:
    label = "saga"

    def __init__(self, bench: Any, poll: float) -> None:
        self.bench, self.poll = bench, poll
        self.submit_times: list[float] = []
        states = ", ".join(f"'{s}'" for s in DONE_STATES)
        self.batch_sql = (f"SELECT count(*) FROM saga_executions "
                          f"WHERE id LIKE :p AND state IN ({states})")

    def one(self, timeout: float) -> float:
        engine = self.bench.engine
        started = time.perf_counter()
        handle = engine.start(self.bench.SAGA_NAME, {})
        self.submit_times.append(time.perf_counter() - started)
        execution = handle.wait(timeout=timeout, interval=self.poll)
        elapsed = time.perf_counter() - started
        if execution.state.value != "completed":
            raise BenchError(f"saga {handle.id} ended {execution.state.value}: "
                             f"{execution.record.failure_reason}")
        return elapsed

    def submit(self, batch: str, count: int) -> None:
        for index in range(count):
            self.bench.engine.start(self.bench.SAGA_NAME, {}, execution_id=f"{batch}-{index}")

    def finished(self, batch: str) -> int:
        return int(_scalar(self.bench, self.batch_sql, p=f"{batch}-%"))

    def verify(self, batch: str, count: int) -> None:
        completed = _scalar(self.bench, "SELECT count(*) FROM saga_executions "
                                        "WHERE id LIKE :p AND state = 'completed'",
                            p=f"{batch}-%")
        if completed != count:
            raise BenchError(f"saga batch {batch}: {completed}/{count} completed")
        # Spot-check through the public API as well.
        execution = self.bench.engine.handle(f"{batch}-{count - 1}").wait(timeout=5)
        if len(execution.steps) != self.bench.STEPS_PER_RUN:
            raise BenchError(f"saga {batch}-{count - 1} has {len(execution.steps)} steps")


def _process_cpu_seconds(worker_pid: int | None) -> dict[str, float]:
    """CPU seconds used so far by the worker's processes, PostgreSQL, RabbitMQ and this
    driver (Linux /proc; other users of the same servers are counted too)."""
    groups = {"worker": 0.0, "postgres": 0.0, "rabbitmq": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        # fields[0] = state, [2] = pgid, [11] = utime, [12] = stime
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if worker_pid is not None and int(fields[2]) == worker_pid:
            groups["worker"] += cpu
        elif name.startswith("postgres"):
            groups["postgres"] += cpu
        elif name.startswith("beam.smp"):
            groups["rabbitmq"] += cpu
    own = os.times()
    groups["driver"] = own.user + own.system
    return groups


def _throughput_round(side: Any, count: int, steps: int, poll: float, timeout: float,
                      worker_pid: int | None = None) -> dict[str, float]:
    batch = f"{side.label[0]}{uuid.uuid4().hex[:12]}"
    cpu_before = _process_cpu_seconds(worker_pid) if worker_pid else None
    started = time.perf_counter()
    side.submit(batch, count)
    submitted = time.perf_counter()
    _wait_until(lambda: side.finished(batch) >= count, timeout, poll,
                f"{side.label} batch of {count}")
    elapsed = time.perf_counter() - started
    result = {"seconds": elapsed, "submit": submitted - started,
              "steps_per_s": count * steps / elapsed}
    if cpu_before is not None:
        cpu_after = _process_cpu_seconds(worker_pid)
        for group, before in cpu_before.items():
            result[f"cpu_{group}"] = (cpu_after[group] - before) * 1000 / (count * steps)
    side.verify(batch, count)
    return result


# --- reporting -----------------------------------------------------------------------------
def _spread(samples: list[float]) -> dict[str, float]:
    q1, _median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"median": statistics.median(samples), "min": min(samples), "p25": q1,
            "p75": q3, "max": max(samples), "iqr": q3 - q1}


def _loadavg() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def _print_environment(bench: Any) -> None:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print("== machine")
    print(f"  cpu_count={os.cpu_count()}  usable_cpus={affinity}  "
          f"platform={platform.platform()}  machine={platform.machine()}")
    print(f"  python={platform.python_version()} ({platform.python_implementation()})  "
          f"load average at start={_loadavg()}")
    names = ("celery-saga-engine", "celery", "kombu", "amqp", "billiard", "SQLAlchemy",
             "psycopg", "alembic")
    print("  " + "  ".join(f"{name}={_version(name)}" for name in names))
    postgres = _scalar(bench, "SHOW server_version")
    rabbit = "n/a"
    with contextlib.suppress(Exception), bench.app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=1)
        properties = getattr(connection.connection, "server_properties", {}) or {}
        rabbit = properties.get("version", "n/a")
        rabbit = rabbit.decode() if isinstance(rabbit, bytes) else rabbit
    print(f"  postgresql={postgres}  rabbitmq={rabbit}")
    print("== setup")
    print("  one `celery worker`: prefork --concurrency 2 --prefetch-multiplier 1 -O fair, "
          "no events, no gossip/mingle/heartbeat")
    acks = "acks_late" if bench.CHAIN_ACKS_LATE else "early ack (Celery default)"
    print(f"  A chain: {bench.STEPS_PER_RUN} x bench.write (1 INSERT each, {acks}); done = "
          "marker row of the last task, polled in PostgreSQL (no result backend)")
    print(f"  B saga : {bench.STEPS_PER_RUN} no-op plain-function steps, PostgreSQL store; "
          "latency done = handle.wait(), throughput done = count of settled executions")
    print(f"  queue={bench.QUEUE}  schema={bench.SCHEMA}")


def _ratio_line(name: str, ratio: float, target: str, ok: bool) -> str:
    return f"  {name:<28} {ratio:6.2f}x   target {target:<8} {'OK' if ok else 'MISSED'}"


def _report(latency: dict[str, list[float]], throughput: dict[str, list[dict[str, float]]],
            submit: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(f"\n== latency, one run end to end (ms), {args.samples} samples each, "
          f"interleaved A B, poll {args.poll * 1000:g} ms")
    print(f"  {'':<6} {'median':>8} {'min':>8} {'p25':>8} {'p75':>8} {'max':>8} {'IQR':>8}")
    stats = {}
    for side in ("chain", "saga"):
        stats[side] = s = _spread([x * 1000 for x in latency[side]])
        print(f"  {side:<6} {s['median']:8.1f} {s['min']:8.1f} {s['p25']:8.1f} "
              f"{s['p75']:8.1f} {s['max']:8.1f} {s['iqr']:8.1f}")
    print("  of which the client's submit call (median ms): "
          f"chain apply_async {statistics.median(submit['chain']) * 1000:.2f}, "
          f"saga engine.start {statistics.median(submit['saga']) * 1000:.2f}")
    print(f"\n== throughput, {args.batch} runs in flight x {args.rounds} rounds each, "
          "interleaved A B (steps/s = 5 x runs / wall time)")
    for side in ("chain", "saga"):
        rounds = throughput[side]
        detail = "  ".join(f"{r['steps_per_s']:7.1f} ({r['seconds']:.2f}s, submit "
                           f"{r['submit']:.2f}s)" for r in rounds)
        print(f"  {side:<6} median {statistics.median(r['steps_per_s'] for r in rounds):7.1f} "
              f"steps/s   rounds: {detail}")
    if "cpu_worker" in throughput["chain"][0]:
        print("  CPU ms per step during the rounds (mean; postgres/rabbitmq include any other "
              "load on those servers):")
        for side in ("chain", "saga"):
            rounds = throughput[side]
            parts = [f"{group} {statistics.mean(r['cpu_' + group] for r in rounds):5.2f}"
                     for group in ("worker", "postgres", "rabbitmq", "driver")]
            total = sum(statistics.mean(r["cpu_" + g] for r in rounds)
                        for g in ("worker", "postgres", "rabbitmq", "driver"))
            print(f"    {side:<6} " + "  ".join(parts) + f"  total {total:5.2f}")
    latency_ratio = stats["saga"]["median"] / stats["chain"]["median"]
    chain_tp = statistics.median(r["steps_per_s"] for r in throughput["chain"])
    saga_tp = statistics.median(r["steps_per_s"] for r in throughput["saga"])
    throughput_ratio = saga_tp / chain_tp
    print("\n== saga / chain (medians)")
    print(_ratio_line("latency   saga/chain", latency_ratio, "<= 1.3x",
                      latency_ratio <= LATENCY_TARGET))
    print(_ratio_line("throughput saga/chain", throughput_ratio, ">= 0.8x",
                      throughput_ratio >= THROUGHPUT_TARGET))


def _print_profile(bench: Any, windows: dict[str, tuple[float, float]]) -> None:
    import bench_profile

    print("\n== profile: mean per task inside the worker (ms, counts), from task_prerun to "
          "task_postrun")
    print("   stmts = SQL statements (all engines), commit = COMMITs, ping = pool pre-pings;")
    print("   saga: snap/claim/record = store calls of run_node, publish = next node message, "
          "body = step function;")
    print("   chain: body = its INSERT; its next-link publish is inside Celery, so in 'other'")
    with bench.bench_db().connect() as connection:
        for line in bench_profile.summarize(connection, windows):
            print(line)


# --- main ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    run_id = uuid.uuid4().hex[:10]
    _configure_environment(run_id, args.profile)
    import bench_app as bench  # after _configure_environment: it reads the environment

    deadline = Deadline(args.max_seconds)
    began = time.monotonic()
    worker: Worker | None = None
    schema_created = False
    try:
        _prepare_database(bench)
        schema_created = True
        _print_environment(bench)
        worker = Worker(bench, run_id)
        worker.start()
        sides = {"chain": ChainSide(bench, args.poll), "saga": SagaSide(bench, args.poll)}

        # Warm-up (not measured): every pool process opens its connections, migrates once.
        for _ in range(4):
            for side in sides.values():
                side.one(args.run_timeout)
        for side in sides.values():
            _throughput_round(side, 20, bench.STEPS_PER_RUN, args.batch_poll, args.batch_timeout)
        print(f"  warm-up done after {time.monotonic() - began:.1f}s", flush=True)

        windows: dict[str, tuple[float, float]] = {}
        for side in sides.values():
            side.submit_times.clear()
        latency: dict[str, list[float]] = {"chain": [], "saga": []}
        window_start = time.time()
        for _ in range(args.samples):
            for name in ("chain", "saga"):
                deadline.check("latency")
                worker.alive()
                latency[name].append(sides[name].one(args.run_timeout))

        windows["latency"] = (window_start, time.time())
        throughput: dict[str, list[dict[str, float]]] = {"chain": [], "saga": []}
        window_start = time.time()
        for _ in range(args.rounds):
            for name in ("chain", "saga"):
                deadline.check("throughput")
                worker.alive()
                result = _throughput_round(
                    sides[name], args.batch, bench.STEPS_PER_RUN, args.batch_poll,
                    args.batch_timeout, worker.pid if bench.PROFILE else None)
                throughput[name].append(result)
                print(f"  throughput round {name}: {result['steps_per_s']:.1f} steps/s",
                      flush=True)

        windows["throughput"] = (window_start, time.time())
        submit = {name: side.submit_times for name, side in sides.items()}
        _report(latency, throughput, submit, args)
        print(f"\nload average at end: {_loadavg()}")
        if bench.PROFILE:
            worker.stop(keep_log=args.keep)  # pool processes flush their last rows on exit
            _print_profile(bench, windows)
        print(f"finished in {time.monotonic() - began:.1f}s")
        return 0
    except (BenchError, TimeoutError):
        if worker is not None:
            print(f"--- last lines of the worker log ---\n{worker.tail()}", file=sys.stderr)
        raise
    finally:
        if worker is not None:
            worker.stop(keep_log=args.keep)
        with contextlib.suppress(Exception):
            purged = _purge_queue(bench)
            if purged:
                print(f"purged {purged} leftover message(s) from {bench.QUEUE}")
        if schema_created and not args.keep:
            with contextlib.suppress(Exception):
                _drop_schema(bench)
        elif schema_created:
            print(f"schema kept: {bench.SCHEMA}")
        with contextlib.suppress(Exception):
            bench.engine.db.dispose()
            bench.bench_db().dispose()


def main() -> int:
    args = _parse_args()
    with _sigterm_as_interrupt():
        try:
            return run(args)
        except (BenchError, TimeoutError) as error:
            print(f"benchmark failed: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; cleaned up", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
