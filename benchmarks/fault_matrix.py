"""The fault matrix: batches of sagas on real workers while the store or the broker is cut.

For each fault, 2 ``celery worker`` processes (prefork, concurrency 2) and a ``celery beat``
reach PostgreSQL and RabbitMQ through TCP proxies. A batch of five-step runs starts (a
quarter of them fail at step 4 and unwind); once reversals are running, a proxy drops every
connection and refuses new ones for the fault's duration. Every step and reversal writes
one ledger row per execution straight to PostgreSQL, so the table can count doubles.

    python benchmarks/fault_matrix.py                  # every fault, 100 runs each
    python benchmarks/fault_matrix.py --faults pg-10s --runs 40

Prints one Markdown row per fault: runs ended (completed or failed), parked, forward and
reversal doubles (keys run more than once), and seconds from the restore to the last run
ending. Library defaults throughout (lease 30 s, recover_after 45 s, sweeps every 5/15 s).
The failover rows (store outages longer than a lease, one worker cut off from the store,
SIGKILLs) are in ``failover_matrix.py``, which shares this module's helpers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_saga import ExecutionState  # noqa: E402
from tests.conftest import (  # noqa: E402
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    spawn_beat,
    stop_workers,
)
from tests.faults import CuttableProxy  # noqa: E402
from tests.sagaapp import TestApp  # noqa: E402

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass(frozen=True)
class Fault:
    name: str
    target: str  # "postgres" or "rabbitmq"
    seconds: float
    during: str  # "unwind": cut once reversals run; "forward": once steps run


FAULTS = {
    f.name: f
    for f in (
        Fault("pg-1s", "postgres", 1, "unwind"),
        Fault("pg-10s", "postgres", 10, "unwind"),
        Fault("pg-60s", "postgres", 60, "unwind"),
        Fault("pg-10s-forward", "postgres", 10, "forward"),
        Fault("amqp-10s", "rabbitmq", 10, "unwind"),
    )
}


def run_fault(fault: Fault, runs: int, unwinding: int, tmp: Path) -> dict[str, Any]:
    pg, mq = CuttableProxy(5432), CuttableProxy(5672)
    direct = _test_database_url()
    store = direct.replace("127.0.0.1:5432", f"127.0.0.1:{pg.port}")
    broker = AMQP.replace("127.0.0.1:5672", f"127.0.0.1:{mq.port}")
    queue = f"saga-faults-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": broker,
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_LEDGER": direct,
        "SAGA_TEST_QUEUE": queue,
        "SAGA_TEST_LEASE": "30",
        "SAGA_TEST_RECOVER_AFTER": "45",
        "SAGA_TEST_SWEEP_INTERVAL": "5",
        "PYTHONPATH": str(ROOT),
    }
    os.environ["SAGA_TEST_LEDGER"] = direct
    client = TestApp(AMQP, direct, queue)
    workers, _ = _spawn_workers(env, queue, tmp, count=2)
    beat = spawn_beat(env, tmp)
    try:
        _wait_ready(client, 2, workers)
        ids = _start_batch(client, runs, unwinding)
        direction = "compensate" if fault.during == "unwind" else "forward"
        wait_until(lambda: _ledger_rows(client, ids, direction) >= 5, 120)
        proxy = pg if fault.target == "postgres" else mq
        proxy.cut(fault.seconds)
        proxy.wait_restored()
        restored = time.monotonic()
        ended_at = wait_until(lambda: _settled(client, ids), fault.seconds + 300)
        return _tally(client, ids, fault, (ended_at or time.monotonic()) - restored)
    finally:
        stop_workers([*workers, beat])
        pg.close()
        mq.close()


def _start_batch(client: TestApp, runs: int, unwinding: int) -> list[str]:
    ids, every = [], max(1, runs // max(1, unwinding))
    for index in range(runs):
        plan: dict[str, Any] = {f"s{n}": {"sleep": 0.2, "undo_sleep": 0.3} for n in range(1, 6)}
        if index % every == 0 and index // every < unwinding:
            plan["s4"] = {"fail": True, "sleep": 0.2}
        ids.append(client.engine.start("five", {"order": index, "plan": plan}).id)
    return ids


def _ledger_rows(client: TestApp, ids: list[str], direction: str) -> int:
    return sum(1 for i in ids[:50] for e in client.entries(i) if e.direction == direction)


def _settled(client: TestApp, ids: list[str]) -> bool:
    done = (ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK)
    return all(client.engine.get(i).state in done for i in ids)


def wait_until(condition: Any, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except Exception:  # the store may be cut: ask again
            pass
        time.sleep(0.5)
    return None


def _tally(client: TestApp, ids: list[str], fault: Fault, recovered: float) -> dict[str, Any]:
    states = Counter(client.engine.get(i).state for i in ids)
    keys: Counter[tuple[str, str]] = Counter()
    for i in ids:
        for entry in client.entries(i):
            keys[(entry.direction, entry.key)] += 1
    doubles = Counter(direction for (direction, _), n in keys.items() if n > 1)
    return {
        "fault": fault.name,
        "runs": len(ids),
        "ended": states[ExecutionState.COMPLETED] + states[ExecutionState.FAILED],
        "parked": states[ExecutionState.COMPENSATION_STUCK],
        "forward doubles": doubles["forward"],
        "reversal doubles": doubles["compensate"],
        "seconds to settle after restore": round(recovered, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--unwinding", type=int, default=25)
    args = parser.parse_args()
    rows = []
    for name in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix="saga-fault-") as folder:
            rows.append(run_fault(FAULTS[name], args.runs, args.unwinding, Path(folder)))
            print(rows[-1], flush=True)
    header = list(rows[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[h]) for h in header) + " |")


if __name__ == "__main__":
    main()
