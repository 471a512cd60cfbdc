"""How long ``celery_saga.testing.explore`` takes: a saga of ten steps and two waits, and
the example project's order saga with its payment sub-saga, on the embedded default.

The issue's budget is 10 s for the first. A timed unit test would fail on a busy machine
and pass on a fast one whatever the code does, so the tests only check that every point is
explored; this prints the seconds (median of ``--rounds``) and the points beside them.

    python benchmarks/explore_time.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _sagas() -> dict[str, tuple[Any, dict[str, Any], dict[str, Any]]]:
    sys.path.insert(0, str(ROOT))
    from example_project.sagas import order, payment
    from tests.test_explore import ten_step_saga

    return {
        "ten steps, two waits": (ten_step_saga(), {}, {}),
        "example order saga": (
            order,
            {"order_id": "X1", "items": ["a", "b", "c"]},
            {"sagas": [payment], "signals": {"approved": {"by": "ana"}}},
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from celery_saga.testing import explore

    for name, (saga, payload, options) in _sagas().items():
        seconds, points = [], 0
        for _ in range(args.rounds):
            started = time.monotonic()
            report = explore(saga, payload, **options)
            seconds.append(time.monotonic() - started)
            points = len(report.points)
            assert report.ok, str(report)
        spread = ", ".join(f"{s:.1f}" for s in seconds)
        print(f"{name:<22} {points:>3} points  {statistics.median(seconds):5.1f} s ({spread})")


if __name__ == "__main__":
    main()
