"""The embedded default (SQLite store, in-process worker) on three workloads, beside bunqueue.

Each round runs the three workloads one after the other, in a fresh process each (so each
gets its own SQLite file, worker and CPU counter), in an order that rotates from round to
round; every run of a workload is started at once, ``--runs`` (500) in flight:

``forward``  five no-op steps, each with a no-op compensation; none fails.
``unwind``   four such steps, then a fifth that raises (``retry=1``): four reversals, the
             run ends ``failed``.
``signal``   a step, ``wait_for("go")``, a step. The driver (the same process) signals each
             run once it sees it waiting, as an application's webhook handler would.

Per workload it prints workflows/s (runs / wall time from the first start to the last
settled run), CPU per workflow (``time.process_time`` of the one process: the driver, the
worker's threads and SQLite together) and SQL statements per workflow (the driver's two
small reads per 20 ms poll included), the medians of the rounds, beside bunqueue's figures
(``BUNQUEUE``), which are issue 30's targets too, and beside plain Celery on the same
embedded worker (``embedded_celery.py``: a chain of five tasks; a chain whose fifth task
fails, its ``link_error`` four compensation tasks), run in the same rotation: the floor a
saga whose steps are Celery tasks cannot go below.

    python benchmarks/embedded.py --runs 500 --rounds 3
    # one workload in this process, with a CPU profile of every thread (pstats format)
    python benchmarks/embedded.py --workload unwind --profile unwind.prof
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import embedded_celery

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("forward", "unwind", "signal")
#: The plain Celery floor of a workload, run as a workload of its own.
FLOOR = "celery-"
#: bunqueue 2.9.5, embedded SQLite mode (it fsyncs every commit), 500 workflows in flight,
#: median of 3 rounds, on the same 2-core machine: workflows/s and CPU ms per workflow, as
#: measured for issue 30 (its table). They are the targets too.
BUNQUEUE = {"forward": (148.0, 5.3), "unwind": (120.0, 6.4), "signal": (200.0, 4.1)}


def _engine(folder: str, options: dict[str, Any]) -> tuple[Any, Any]:
    from celery import Celery

    from celery_saga import Saga, SagaEngine

    app = Celery("embedded-bench", broker="memory://localhost/")
    app.conf.update(worker_hijack_root_logger=False, **options)
    engine = SagaEngine(app, store_url=f"sqlite:///{folder}/bench.sqlite3")

    def noop() -> None:
        return None

    def fail() -> None:
        raise RuntimeError("the last step fails on purpose")

    forward = Saga("forward")
    for index in range(1, 6):
        forward.step(f"s{index}", noop, compensate=noop)
    unwind = Saga("unwind")
    for index in range(1, 5):
        unwind.step(f"s{index}", noop, compensate=noop)
    unwind.step("s5", fail, retry=1)
    signal = Saga("signal").step("before", noop).wait_for("go").step("after", noop)
    for saga in (forward, unwind, signal):
        engine.register(saga)
    engine.ensure_schema()
    return app, engine


def _settled(engine: Any, saga: str, signalled: set[str]) -> int:
    """How many runs of ``saga`` have settled; on the way, signal those waiting at the gate.
    Two small reads a poll (counts per state, the ids of waiting runs), so that the waiting
    adds little to the CPU measured."""
    from sqlalchemy import func, select

    from celery_saga.store.tables import executions

    runs = executions.c.saga_name == saga
    waiting = select(executions.c.id).where(runs, executions.c.state == "waiting")
    for row in engine.db.read(waiting):
        if row["id"] not in signalled:
            signalled.add(row["id"])
            engine.signal(row["id"], "go")
    done = executions.c.state.in_(("completed", "failed"))
    counted = select(func.count().label("n")).where(runs, done)
    return int(engine.db.read(counted)[0]["n"])


def _run(
    workload: str, runs: int, options: dict[str, Any], worker: dict[str, Any], profile: str | None
) -> dict[str, float]:
    """One workload in this process: a warm-up run, then ``runs`` runs started at once.
    With ``profile``, a file to write the CPU profile of every thread to."""
    from celery_saga.worker.embedded import embedded_worker

    profilers = _profile_threads() if profile else []
    with tempfile.TemporaryDirectory() as folder:
        app, engine = _engine(folder, options)
        with embedded_worker(app, **worker):
            signalled: set[str] = set()
            engine.start(workload, {})
            while _settled(engine, workload, signalled) < 1:  # warm-up
                time.sleep(0.01)
            before = engine.db.statement_count
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(runs):
                engine.start(workload, {})
            while _settled(engine, workload, signalled) < runs + 1:
                time.sleep(0.02)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            statements = engine.db.statement_count - before
        engine.db.dispose()
    if profile:
        _write_profile(profilers, profile)
    return {"per_s": runs / wall, "cpu_ms": 1000 * cpu / runs, "statements": statements / runs}


def _profile_threads() -> list[Any]:
    """A cProfile of each thread started from now on and of this one, timed by the thread's
    own CPU time (``time.thread_time``), so a thread waiting for the SQLite lock, the broker
    or the GIL adds nothing; the worker's pool threads start after this. The calls still
    open in threads that outlive the profile (the consumer's loop, the heartbeat's sleep)
    are closed with the dumping thread's clock: ignore their totals."""
    import cProfile
    import threading

    profilers: list[Any] = []

    def start(*_: Any) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()  # replaces this hook for the thread

    threading.setprofile(start)
    start()
    return profilers


def _write_profile(profilers: list[Any], path: str) -> None:
    import pstats
    import threading

    threading.setprofile(None)  # type: ignore[arg-type]
    for profiler in profilers:
        profiler.create_stats()
    stats = pstats.Stats(profilers[0])
    for profiler in profilers[1:]:
        stats.add(profiler)
    stats.dump_stats(path)


def _child(workload: str, runs: int, args: argparse.Namespace) -> dict[str, float]:
    """``workload`` (or its plain Celery floor, ``celery-<workload>``) in a fresh process."""
    command = [sys.executable, __file__, "--workload", workload, "--runs", str(runs)]
    command += ["--options", args.options, "--worker", args.worker]
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _report(results: dict[str, list[dict[str, float]]], runs: int, rounds: int) -> None:
    print(f"embedded default, {runs} workflows in flight, median of {rounds} round(s)")
    head = f"{'workload':<9} {'wf/s':>7} {'CPU ms/wf':>10} {'stmts/wf':>9}"
    head += f" {'bunqueue wf/s':>14} {'CPU ms':>7} {'ratio wf/s':>11} {'ratio CPU':>10}"
    print(f"{head} {'Celery wf/s':>12} {'CPU ms':>7}")
    for workload, rows in results.items():
        if not rows or workload.startswith(FLOOR):
            continue
        floor = results.get(FLOOR + workload) or []
        plain = (
            f"{statistics.median(r['per_s'] for r in floor):>12.1f} "
            f"{statistics.median(r['cpu_ms'] for r in floor):>7.2f}"
            if floor
            else f"{'-':>12} {'-':>7}"
        )
        per_s = statistics.median(r["per_s"] for r in rows)
        cpu = statistics.median(r["cpu_ms"] for r in rows)
        statements = statistics.median(r["statements"] for r in rows)
        peer_s, peer_cpu = BUNQUEUE[workload]
        print(
            f"{workload:<9} {per_s:>7.1f} {cpu:>10.2f} {statements:>9.1f} {peer_s:>14.0f} "
            f"{peer_cpu:>7.1f} {per_s / peer_s:>10.2f}x {cpu / peer_cpu:>9.2f}x {plain}"
        )
        spread = ", ".join(f"{r['per_s']:.0f}/{r['cpu_ms']:.1f}" for r in rows)
        print(f"{'':<9} rounds (wf/s / CPU ms): {spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="workflows started at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--options", default="{}", help="JSON: Celery settings of the app")
    parser.add_argument("--worker", default="{}", help="JSON: embedded_worker() arguments")
    floors = tuple(FLOOR + w for w in embedded_celery.WORKLOADS)
    parser.add_argument("--workload", choices=WORKLOADS + floors, help="one, in this process")
    parser.add_argument("--no-floor", action="store_true", help="without plain Celery beside")
    parser.add_argument("--profile", metavar="FILE", help="with --workload: write a CPU profile")
    args = parser.parse_args()
    if args.workload:
        options, worker = json.loads(args.options), json.loads(args.worker)
        if args.workload.startswith(FLOOR):
            floor = args.workload.removeprefix(FLOOR)
            print(json.dumps(embedded_celery.run(floor, args.runs, options, worker)))
            return
        print(json.dumps(_run(args.workload, args.runs, options, worker, args.profile)))
        return
    chosen = [w for w in args.workloads.split(",") if w]
    if not args.no_floor:
        chosen += [FLOOR + w for w in chosen if w in embedded_celery.WORKLOADS]
    results: dict[str, list[dict[str, float]]] = {w: [] for w in chosen}
    for round_number in range(args.rounds):
        shift = round_number % len(chosen)
        for workload in chosen[shift:] + chosen[:shift]:
            results[workload].append(_child(workload, args.runs, args))
    _report(results, args.runs, args.rounds)


if __name__ == "__main__":
    main()
