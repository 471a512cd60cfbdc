#!/usr/bin/env python
"""Benchmark: ``chain_vs_saga.py`` with tracing off, with the API alone and with an SDK, in turns.

One run of this script runs the broker benchmark (``chain_vs_saga.py``, one broker) once per
tracing mode (``tracing_modes.py``: ``off``, ``api``, ``sdk``) and ``--turns`` times over,
each a child process with a fresh worker, schema and queue. Each turn takes the modes in a
rotated order (off, api, sdk; then api, sdk, off; ...) so that no mode always runs last on a
machine whose load drifts. Every figure compared is a ratio against the plain chain measured
in the same child, or the worker's CPU per step, which other processes do not inflate as much
as wall time.

It prints each turn and, per mode, the median over the turns, and each mode against ``off``.
Arguments it does not know go to ``chain_vs_saga.py`` unchanged. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_infra import loadavg

HERE = Path(__file__).resolve().parent
MODES = ("off", "api", "sdk")
FIGURES = (
    ("latency saga/chain", "latency_ratio", "x"),
    ("throughput saga/chain", "throughput_ratio", "x"),
    ("forward hop / chain hop", "hop_ratio", "x"),
    ("worker CPU ms/step saga", "saga_cpu", "ms"),
    ("worker CPU ms/step unwind", "unwind_cpu", "ms"),
)


def _parse_args() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3, help="times each mode runs")
    parser.add_argument("--broker", choices=("rabbitmq", "redis"), default="rabbitmq")
    return parser.parse_known_args()


def one(mode: str, broker: str, rest: list[str], tree: Path = HERE.parent) -> dict[str, float]:
    """The figures of one ``chain_vs_saga.py`` run of the package in ``tree`` (a checkout:
    its own code and its own benchmark), traced as ``mode``."""
    import bench_report

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = Path(out.name)
    command = [sys.executable, str(tree / "benchmarks" / "chain_vs_saga.py"), *rest]
    command += ["--broker", broker, "--json-out", str(path)]
    command += ["--tracing", mode] if mode != "off" or tree == HERE.parent else []
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's package, not the installed one
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        result: dict[str, Any] = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    return bench_report.summary(result)


def main() -> int:
    args, rest = _parse_args()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    print(f"{'turn':>4} {'mode':>8} {'load':>5} " + " ".join(f"{f[0]:>26}" for f in FIGURES))
    for turn in range(args.turns):
        order = MODES[turn % 3 :] + MODES[: turn % 3]
        for mode in order:
            load = loadavg().split()[0]
            figures = one(mode, args.broker, rest)
            runs[mode].append(figures)
            print_turn(turn, mode, load, figures)
    print_medians(runs)
    return 0


def print_turn(turn: int, label: str, load: str, figures: dict[str, float]) -> None:
    """One row: a turn's run of ``label`` (a mode or a tree)."""
    cells = " ".join(f"{figures[key]:>24.3f}{unit:>2}" for _, key, unit in FIGURES)
    print(f"{turn + 1:>4} {label:>8} {load:>5} {cells}", flush=True)


def print_medians(runs: dict[str, list[dict[str, float]]]) -> None:
    """Each label's median over its turns, against the first label's."""
    first = next(iter(runs))
    print(f"\nmedian over the turns, and against {first}:")
    base = {key: statistics.median(r[key] for r in runs[first]) for _, key, _ in FIGURES}
    for label, done in runs.items():
        cells = []
        for _, key, _unit in FIGURES:
            value = statistics.median(r[key] for r in done)
            cells.append(f"{value:>10.3f} ({(value / base[key] - 1) * 100:+6.1f}%)")
        print(f"  {label:<8} " + " ".join(f"{c:>26}" for c in cells))
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    sys.exit(main())
