#!/usr/bin/env python
"""Benchmark: what tracing costs a run, with tracing off, with the OpenTelemetry API but
no SDK, and with an SDK whose exporter drops every span (``tracing_modes``).

Each mode runs in a process of its own (a tracer provider is set once per process), and
the modes take turns: ``--rounds`` rounds of off, api, sdk, each round ``--runs`` runs of
a five-step saga under ``task_always_eager`` on a SQLite file (the engine's own work per
run, in one process, without a broker's hops), after ``--warmup`` runs. Prints each mode's
median CPU time per run and its overhead over ``off``. The span count per run (7: the root
and one per step, here no retry) is what a real worker adds per run too;
``chain_vs_saga.py --tracing`` measures it over a broker.
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

import tracing_modes


def _one(mode: str, runs: int, warmup: int) -> float:
    """CPU seconds per run of ``runs`` runs in this process, traced as ``mode`` (CPU
    time: the other processes of a shared machine do not count, nor the disk's flushes)."""
    from celery import Celery

    from celery_saga import Saga, SagaEngine

    app = Celery("tracing_cost", set_as_current=False)
    app.conf.update(task_always_eager=True, broker_url="memory://")
    app.conf.saga_tracing = tracing_modes.setting(mode)
    folder = tempfile.mkdtemp()
    engine = SagaEngine(app, store_url=f"sqlite:///{folder}/store.sqlite3")

    def noop() -> int:
        return 1

    saga = Saga("five")
    for n in range(5):
        saga = saga.step(f"s{n}", noop, compensate=noop)
    engine.register(saga)
    for _ in range(warmup):
        engine.start("five")
    began = time.process_time()
    for _ in range(runs):
        engine.start("five")
    return (time.process_time() - began) / runs


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--mode", choices=tracing_modes.MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(_one(args.mode, args.runs, args.warmup)))
        return 0
    times: dict[str, list[float]] = {mode: [] for mode in tracing_modes.MODES}
    for _ in range(args.rounds):
        for mode in tracing_modes.MODES:
            command = [sys.executable, __file__, "--mode", mode, "--runs", str(args.runs)]
            command += ["--warmup", str(args.warmup)]
            out = subprocess.run(command, check=True, capture_output=True, text=True)
            times[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(times["off"])
    print(f"{args.rounds} rounds x {args.runs} runs of a five-step saga, eager, SQLite")
    for mode, seconds in times.items():
        median = statistics.median(seconds)
        spread = f"{min(seconds) * 1e3:.3f}-{max(seconds) * 1e3:.3f}"
        overhead = (median / base - 1) * 100
        print(f"{mode:4}  {median * 1e3:7.3f} ms CPU/run  (rounds {spread})  {overhead:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
