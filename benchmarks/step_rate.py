#!/usr/bin/env python
"""Benchmark: a step's rate per key, ``step(..., rate=Rate("20/s", key=...))``, on two real
prefork workers (4 pool processes each), PostgreSQL and RabbitMQ or Redis, with a real
``celery beat`` (issue 47: the measured rate within 15% of 20/s over 30 s).

``--runs`` runs of the test app's ``carrier_rated`` saga (tests/sagaapp.py: one step,
``Rate("20/s")`` per carrier, all on one carrier) are started before the workers, so what
is measured is the rate at the door, not how fast this process starts runs. Each body
writes the time it began to a ledger; printed per broker: the calls per second over the
``--window`` seconds after the first ``--skip`` seconds (while the workers meet every queued
message at the door once), each second's count, and the busiest second.

    python benchmarks/step_rate.py --broker both
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for folder in (str(HERE), str(ROOT)):
    if folder not in sys.path:
        sys.path.insert(0, folder)

from sqlalchemy import select  # noqa: E402

from celery_saga import ExecutionState  # noqa: E402
from tests.conftest import fresh_pg_database  # noqa: E402
from tests.sagaapp import ledger  # noqa: E402
from tests.test_crash_recovery import CrashRig  # noqa: E402

BROKERS = {
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
    "redis": "redis://127.0.0.1:6379/3",
}


def measure(broker: str, runs: int, skip: float, window: float) -> tuple[float, list[int]]:
    """(calls per second over the window, calls in each second from the first call)."""
    with tempfile.TemporaryDirectory() as tmp:
        rig = CrashRig(BROKERS[broker], Path(tmp), store=fresh_pg_database("step_rate"))
        try:
            engine, carrier = rig.client.engine, f"bench-{uuid.uuid4().hex[:6]}"
            plan = {"call": {"mark_begin": True, "stamp": True}}
            ids = [
                str(engine.start("carrier_rated", {"carrier": carrier, "plan": plan}).id)
                for _ in range(runs)
            ]
            rig.start_worker(count=2, concurrency=4)
            deadline = time.monotonic() + runs / 5 + 120
            while not all(engine.get(i).state is ExecutionState.COMPLETED for i in ids[-20:]):
                if time.monotonic() > deadline:
                    raise TimeoutError("the runs did not complete")
                time.sleep(1)
            with rig.client.sql.begin() as connection:
                details = connection.execute(
                    select(ledger.c.detail).where(
                        ledger.c.execution_id.in_(ids), ledger.c.direction == "forward_begin"
                    )
                ).scalars()
                began = sorted(float(d.split("at=")[1]) for d in details)
        finally:
            rig.close()
    inside = [t for t in began if skip <= t - began[0] <= skip + window]
    rate = (len(inside) - 1) / (inside[-1] - inside[0])
    seconds = [
        sum(1 for t in began if s <= t - began[0] < s + 1)
        for s in range(int(began[-1] - began[0]) + 1)
    ]
    return rate, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--broker", choices=("rabbitmq", "redis", "both"), default="both")
    parser.add_argument("--runs", type=int, default=800)
    parser.add_argument("--skip", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    for broker in ("rabbitmq", "redis") if args.broker == "both" else (args.broker,):
        rate, seconds = measure(broker, args.runs, args.skip, args.window)
        off = (rate / 20 - 1) * 100
        print(f"{broker}: {rate:.2f} calls/s over {args.window:.0f} s ({off:+.1f}% of 20/s)")
        print(f"  per second: {seconds}")
        print(f"  busiest second: {max(seconds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
