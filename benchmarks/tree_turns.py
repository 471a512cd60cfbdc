#!/usr/bin/env python
"""Benchmark: ``chain_vs_saga.py`` of two checkouts of the package, in turns.

``--tree LABEL=PATH`` twice (or more): each a checkout (``git worktree add``), whose own
package and own benchmark run, tracing off. One run of this script runs each tree's broker
benchmark once per turn, ``--turns`` times, the trees rotated per turn, each a child
process with a fresh worker, schema and queue; printed as ``tracing_turns.py`` prints (the
same figures: ratios against the plain chain of the same child, and the worker's CPU per
step), each tree against the first. Arguments it does not know go to ``chain_vs_saga.py``.
For example, what a feature costs sagas that do not use it:

    git worktree add /tmp/before <commit before the feature>
    python benchmarks/tree_turns.py --tree before=/tmp/before --tree after=. --count-runs 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_infra import loadavg
from tracing_turns import FIGURES, one, print_medians, print_turn


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--broker", choices=("rabbitmq", "redis"), default="rabbitmq")
    args, rest = parser.parse_known_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    labels = list(trees)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    print(f"{'turn':>4} {'tree':>8} {'load':>5} " + " ".join(f"{f[0]:>26}" for f in FIGURES))
    for turn in range(args.turns):
        for label in labels[turn % len(labels) :] + labels[: turn % len(labels)]:
            load = loadavg().split()[0]
            figures = one("off", args.broker, rest, Path(trees[label]).resolve())
            runs[label].append(figures)
            print_turn(turn, label, load, figures)
    print_medians(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
