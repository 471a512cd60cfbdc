"""Worker restarts as a deploy does them, 20 runs per way (guarantee 27).

Two ``celery worker`` processes (prefork, concurrency 2) and a ``celery beat`` on RabbitMQ +
PostgreSQL, lease 30 s. Each round starts 4 runs of the test app's ``five`` saga whose step
``s3`` sleeps 8 s (or whose ``s4`` fails and the reversal of ``s2`` sleeps 8 s), stops both
workers once the 4 bodies run, starts 2 fresh ones and drives every run to its end. Ways:

- ``sigterm-step`` / ``sigterm-reversal``: SIGTERM to each worker's process group (what
  systemd's ``KillMode=control-group`` sends on ``systemctl restart``);
- ``sigterm-then-sigkill``: the same, then SIGKILL to the group after a 10 s grace
  (``TimeoutStopSec=10``);
- ``control-shutdown``: ``celery control shutdown`` (a warm shutdown: the bodies finish).

Counted per way: runs that completed (or unwound for their own reason: the failing ``s4``),
failures recorded for an interrupted body (an ``error`` or reason that is not the step's
own), bodies run more than twice, and the seconds from the fresh workers being ready to the
interrupted step (or reversal) running again.

    python benchmarks/deploy_restarts.py --ways sigterm-step,control-shutdown --rounds 5
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_saga import ExecutionState  # noqa: E402
from tests.conftest import _spawn_workers, _wait_ready, stop_workers  # noqa: E402
from tests.test_crash_recovery import CrashRig, crash_rig, wait_for  # noqa: E402

WAYS = ("sigterm-step", "sigterm-reversal", "sigterm-then-sigkill", "control-shutdown")
SLEEP = 8.0
#: What the failing step of the test app says: the run's own reason to unwind.
OWN = "refused order"


def _plan(way: str) -> dict[str, Any]:
    if way == "sigterm-reversal":
        return {"s4": {"fail": True}, "s2": {"undo_first_sleep": SLEEP}}
    return {"s3": {"first_sleep": SLEEP}}


def _running(rig: CrashRig, way: str, run_id: str) -> bool:
    """Whether the body to interrupt (s3, or the reversal of s2) of ``run_id`` runs."""
    steps = {s.name: s for s in rig.client.engine.get(run_id).steps}
    if way == "sigterm-reversal":
        return "s2" in steps and steps["s2"].compensation_attempts >= 1
    return "s3" in steps and steps["s3"].status.value == "running"


def _stop(rig: CrashRig, way: str, workers: list[subprocess.Popen[bytes]]) -> None:
    time.sleep(0.5)  # well inside the bodies' sleep
    if way == "control-shutdown":
        names = [n for reply in rig.client.app.control.ping(timeout=1) for n in reply]
        rig.client.app.control.shutdown(destination=[n for n in names if rig.queue in n])
    else:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=10 if way == "sigterm-then-sigkill" else 60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def _again(rig: CrashRig, way: str, run_id: str) -> bool:
    """Whether the interrupted step (or reversal) of ``run_id`` runs again, or is done."""
    steps = {s.name: s for s in rig.client.engine.get(run_id).steps}
    if way == "sigterm-reversal":
        return steps["s2"].compensation_attempts >= 2 or steps["s2"].compensated_at is not None
    return steps["s3"].attempts >= 2 or steps["s3"].status.value == "completed"


def _two_workers(rig: CrashRig) -> list[subprocess.Popen[bytes]]:
    """Two workers with node names of their own (a takeover asks a holder by its name)."""
    rig.generation += 1
    logdir = rig.tmp / f"gen{rig.generation}"
    logdir.mkdir()
    workers, _ = _spawn_workers(rig.env, rig.queue, logdir, count=2)
    rig.workers.extend(workers)
    _wait_ready(rig.client, 2, workers)
    return workers


def run_round(rig: CrashRig, way: str, order: int) -> dict[str, Any]:
    workers = _two_workers(rig)
    runs = [
        rig.client.engine.start("five", {"order": order + i, "plan": _plan(way)}) for i in range(4)
    ]
    ids = [run.id for run in runs]
    wait_for(lambda: any(_running(rig, way, run_id) for run_id in ids), timeout=60)
    time.sleep(0.5)
    cut = [run_id for run_id in ids if _running(rig, way, run_id)]
    _stop(rig, way, workers)
    fresh = _two_workers(rig)
    ready = time.monotonic()
    pickup = []
    for run_id in cut:
        wait_for(lambda run_id=run_id: _again(rig, way, run_id), timeout=90)
        pickup.append(time.monotonic() - ready)
    ended = [rig.drive_to_end(run_id, timeout=120) for run_id in ids]
    stop_workers(fresh)  # the next round starts from no worker again
    return {"ids": ids, "ended": ended, "pickup": pickup, "cut": len(cut)}


def tally(rig: CrashRig, way: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ended = [e for r in rounds for e in r["ended"]]
    own = "sigterm-reversal"  # s4 fails on purpose there: an unwind for the run's own reason
    fine = [
        e
        for e in ended
        if e.state is ExecutionState.COMPLETED
        or (
            way == own
            and e.state is ExecutionState.FAILED
            and "refused order" in (e.failure_reason or "")
        )
    ]
    wrong = [
        s
        for e in ended
        for s in e.steps
        if (s.error and "refused order" not in s.error)
        or "SystemExit" in (s.compensation_reason or "")
    ]
    ledger: Counter[str] = Counter()
    for e in ended:
        for entry in rig.client.entries(e.id):
            if entry.direction in ("forward", "compensate"):
                ledger[entry.key] += 1
    pickups = sorted(p for r in rounds for p in r["pickup"])
    return {
        "way": way,
        "runs": len(ended),
        "bodies_interrupted": sum(r["cut"] for r in rounds),
        "as_expected": len(fine),
        "failures_recorded_for_interruptions": len(wrong),
        "effects_twice": sum(1 for n in ledger.values() if n > 1),
        "pickup_s_median": round(pickups[len(pickups) // 2], 2) if pickups else None,
        "pickup_s_max": round(pickups[-1], 2) if pickups else None,
    }


def _its_own(way: str, execution: Any) -> bool:
    return (
        way == "sigterm-reversal"
        and execution.state is ExecutionState.FAILED
        and OWN in (execution.failure_reason or "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--rounds", type=int, default=5, help="rounds of 4 runs per way")
    options = parser.parse_args()
    for way in options.ways.split(","):
        with tempfile.TemporaryDirectory() as folder:
            for rig in crash_rig(
                "postgres-rabbitmq", Path(folder), lease=30.0, recover_after=120.0
            ):
                rounds = [run_round(rig, way, 1000 * n) for n in range(options.rounds)]
                print(tally(rig, way, rounds), flush=True)


if __name__ == "__main__":
    main()
