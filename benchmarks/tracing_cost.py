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


def _checks(engine: object, runs: int) -> tuple[float, float]:
    """What ``api`` does that ``off`` does not: one look at the global tracer provider per
    span boundary. Counted over ``runs`` more runs, and timed alone: (checks per run,
    CPU seconds per check)."""
    import timeit

    from celery_saga.tracing import api

    counted = [0]
    checked = api.provider_set

    def counting() -> bool:
        counted[0] += 1
        return checked()

    api.provider_set = counting  # type: ignore[assignment]
    try:
        for _ in range(runs):
            engine.start("five")  # type: ignore[attr-defined]
    finally:
        api.provider_set = checked  # type: ignore[assignment]
    each = min(timeit.repeat(checked, number=100_000, repeat=5, timer=time.process_time))
    return counted[0] / runs, each / 100_000


def _one(mode: str, runs: int, warmup: int) -> float | list[float]:
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
    per_run = (time.process_time() - began) / runs
    if mode == "api":
        return [per_run, *_checks(engine, 50)]
    return per_run


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
    checks: list[float] = [0.0, 0.0]
    for _ in range(args.rounds):
        for mode in tracing_modes.MODES:
            command = [sys.executable, __file__, "--mode", mode, "--runs", str(args.runs)]
            command += ["--warmup", str(args.warmup)]
            out = subprocess.run(command, check=True, capture_output=True, text=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if isinstance(got, list):
                got, checks = got[0], got[1:]
            times[mode].append(got)
    base = statistics.median(times["off"])
    print(f"{args.rounds} rounds x {args.runs} runs of a five-step saga, eager, SQLite")
    for mode, seconds in times.items():
        median = statistics.median(seconds)
        spread = f"{min(seconds) * 1e3:.3f}-{max(seconds) * 1e3:.3f}"
        overhead = (median / base - 1) * 100
        print(f"{mode:4}  {median * 1e3:7.3f} ms CPU/run  (rounds {spread})  {overhead:+6.1f}%")
    per_run, each = checks
    share = per_run * each / base * 100
    print(
        f"api's only extra work: {per_run:.0f} provider checks per run, {each * 1e6:.3f} us "
        f"CPU each: {per_run * each * 1e6:.1f} us a run, {share:.3f}% of off's CPU per run"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
