"""Failover rows of the fault matrix: store outages longer than a lease, one worker cut off
from the store, and SIGKILLed pool processes and workers (guarantee 30).

The rig of ``fault_matrix.py``: 2 ``celery worker`` processes (prefork, concurrency 2) and a
``celery beat``, PostgreSQL behind a cuttable TCP proxy, RabbitMQ direct, library defaults
(lease 30 s, recover_after 45 s, timer sweep every 5 s, recovery sweep every 15 s). Each run
is the test app's ``failed_eligible`` saga: step ``a`` (instant, compensated), then step
``b``, whose body writes to the ledger (straight to PostgreSQL, never cut) a
``forward_begin`` mark per execution, a ``tick`` every 0.2 s while it runs, and ``forward``
when it ends. A thread notes the ledger's largest row id every 0.1 s: the clock of the marks.

    python benchmarks/failover_matrix.py                    # every row (about an hour)
    python benchmarks/failover_matrix.py --faults cut-45s-free,kill-pool --logs /tmp/x

- ``cut-<N>s-busy`` / ``cut-<N>s-free`` (N = 45, 90, 120, 300): 4 runs on the 4 slots, or 2
  runs (2 slots free), bodies of 5, 40 and 60 s; the store is cut once every body runs.
- ``partition-90s``: worker A reaches the store through its own proxy, worker B and beat
  directly; 2 bodies of 100 s (5 s when run again) on A, then A alone is cut off for 90 s.
- ``kill-pool`` / ``kill-worker``: SIGKILL of the pool process running a body (its pid is in
  the step's ``holder``), or of its whole worker (the process group).

Worker and beat logs stay in the ``--logs`` folder, one subfolder per row.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from celery_saga import ExecutionState  # noqa: E402
from celery_saga.records import StepStatus  # noqa: E402
from celery_saga.store import history  # noqa: E402
from tests.conftest import (  # noqa: E402
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    spawn_beat,
    stop_workers,
)
from tests.faults import CuttableProxy  # noqa: E402
from tests.sagaapp import TestApp, ledger  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from fault_matrix import AMQP, wait_until  # noqa: E402

CUT_ROUNDS = {45: 4, 90: 2, 120: 2, 300: 1}
BUSY, FREE = [(5, 40, 60, 60)], [(5, 60), (40, 60), (60, 60)]
ROWS = [f"cut-{s}s-{m}" for s in CUT_ROUNDS for m in ("busy", "free")]
ROWS += ["partition-90s", "kill-pool", "kill-worker"]


class Rig:
    """Workers, beat, a proxy in front of the store, and a clock for the ledger's rows."""

    def __init__(self, folder: Path, beat_direct: bool = False) -> None:
        self.folder, self.direct = folder, _test_database_url()
        self.proxy = CuttableProxy(5432)
        self.queue = f"saga-failover-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "SAGA_TEST_BROKER": AMQP,
            "SAGA_TEST_STORE": self.direct.replace(":5432", f":{self.proxy.port}"),
            "SAGA_TEST_LEDGER": self.direct,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_LEASE": "30",
            "SAGA_TEST_RECOVER_AFTER": "45",
            "SAGA_TEST_SWEEP_INTERVAL": "5",
            "SAGA_TEST_RECOVER_INTERVAL": "15",
            "PYTHONPATH": str(ROOT),
        }
        self.env_direct = {**self.env, "SAGA_TEST_STORE": self.direct}
        os.environ["SAGA_TEST_LEDGER"] = self.direct
        self.client = TestApp(AMQP, self.direct, self.queue)
        self.client.engine.ensure_schema()
        self.workers: list[Any] = []
        self.nodes: dict[str, Any] = {}  # node prefix (w0, w1, a0...): its worker
        self.beat = spawn_beat(self.env_direct if beat_direct else self.env, folder)
        self.marks: list[tuple[float, int]] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._note_ids, daemon=True).start()

    def spawn(self, prefix: str, direct: bool = False, count: int = 2) -> None:
        (self.folder / prefix).mkdir(exist_ok=True)
        env = self.env_direct if direct else self.env
        workers, _ = _spawn_workers(env, self.queue, self.folder / prefix, count, prefix=prefix)
        self.workers += workers
        self.nodes.update({f"{prefix}{n}": w for n, w in enumerate(workers)})
        _wait_ready(self.client, len([w for w in self.workers if w.poll() is None]), workers)

    def start(self, bodies: list[dict[str, Any]]) -> list[str]:
        plans = [{"a": {}, "b": {"mark_begin": True, "tick": True, **b}} for b in bodies]
        engine = self.client.engine
        return [
            engine.start("failed_eligible", {"order": n, "plan": p}).id for n, p in enumerate(plans)
        ]

    def marks_of(self, execution_id: str) -> list[Any]:
        return [e for e in self.client.entries(execution_id) if e.step == "b"]

    def begins(self, execution_id: str) -> list[Any]:
        return [e for e in self.marks_of(execution_id) if e.direction == "forward_begin"]

    def top_id(self) -> int:
        with self.client.sql.begin() as connection:
            return int(connection.execute(select(func.max(ledger.c.id))).scalar() or 0)

    def time_of(self, row_id: int) -> float | None:
        """When the ledger row ``row_id`` was written (monotonic, to 0.1 s)."""
        return next((at for at, top in list(self.marks) if top >= row_id), None)

    def wait_terminal(self, ids: list[str], timeout: float) -> float | None:
        engine = self.client.engine
        return wait_until(lambda: all(engine.get(i).state.is_terminal for i in ids), timeout)

    def _note_ids(self) -> None:
        while not self._stopped.is_set():
            with contextlib.suppress(Exception):  # the ledger is never cut: ask again
                self.marks.append((time.monotonic(), self.top_id()))
            time.sleep(0.1)

    def close(self) -> None:
        self._stopped.set()
        stop_workers([*self.workers, self.beat])
        self.proxy.close()


@dataclass
class Seen:
    """What the ledger and the store say of one run's step ``b``."""

    exposed: bool  # its first body ran when the store was cut
    again: int  # executions after the first
    overlap: bool  # marks of two executions interleave
    lost: bool  # a body succeeded, yet the step is not completed or carries an error
    unwound: bool
    terminal: bool
    late: int  # late outcomes kept on the history


def look(rig: Rig, execution_id: str, cut_id: int) -> Seen:
    marks = rig.marks_of(execution_id)
    begins = [m for m in marks if m.direction == "forward_begin"]
    ends = [m for m in marks if m.direction == "forward"]
    first = begins[0].detail if begins else None
    ended_first = any(m.detail == first and m.id <= cut_id for m in ends)
    execution = rig.client.engine.get(execution_id)
    step = execution.step("b")
    lost = bool(ends) and (step.status is not StepStatus.COMPLETED or bool(step.error))
    kinds = [e.kind for e in history.load(rig.client.engine.db, execution_id)]
    return Seen(
        exposed=bool(begins) and begins[0].id <= cut_id and not ended_first,
        again=max(0, len(begins) - 1),
        overlap=interleaved([m.detail for m in marks]),
        lost=lost,
        unwound=execution.state is not ExecutionState.COMPLETED
        or any(e.direction == "compensate" for e in rig.client.entries(execution_id)),
        terminal=execution.state.is_terminal,
        late=kinds.count("late-outcome"),
    )


def interleaved(attempts: list[str]) -> bool:
    """Whether the marks of one execution appear again after another execution's."""
    seen: list[str] = []
    for attempt in attempts:
        if seen and seen[-1] == attempt:
            continue
        if attempt in seen:
            return True
        seen.append(attempt)
    return False


def log_counts(folder: Path) -> dict[str, int]:
    text = "\n".join(p.read_text(errors="replace") for p in folder.rglob("*.log"))
    return {
        "store-lost lines": text.count("the saga store is unreachable ("),
        "taken-over lines": text.count("taken over"),
        "tracebacks": text.count("Traceback"),
    }


# -- rows ----------------------------------------------------------------------------------
def cut_row(name: str, folder: Path, rounds: int | None) -> dict[str, Any]:
    seconds, mode = int(name.split("-")[1][:-1]), name.split("-")[2]
    rig = Rig(folder)
    seen: list[Seen] = []
    settle: list[float] = []
    try:
        rig.spawn("w")
        patterns = BUSY if mode == "busy" else FREE
        for index in range(rounds or CUT_ROUNDS[seconds]):
            durations = patterns[index % len(patterns)]
            ids = rig.start([{"sleep": d} for d in durations])
            if not wait_until(lambda ids=ids: all(rig.begins(i) for i in ids), 120):
                raise RuntimeError(f"{name}: the bodies did not all start")
            cut_id = rig.top_id()
            rig.proxy.cut(seconds)
            rig.proxy.wait_restored(seconds + 30)
            restored = time.monotonic()
            ended = rig.wait_terminal(ids, 300 + max(durations))
            settle.append((ended or time.monotonic()) - restored)
            seen += [look(rig, i, cut_id) for i in ids]
            print(f"{name} round {index + 1}: {seen[-len(ids) :]}", flush=True)
    finally:
        rig.close()
    return {
        "row": name,
        "runs": len(seen),
        "bodies running at the cut": sum(s.exposed for s in seen),
        "started again": sum(s.again for s in seen),
        "succeeded recorded failed/lost": sum(s.lost for s in seen),
        "wrongly unwound": sum(s.unwound for s in seen),
        "terminal": sum(s.terminal for s in seen),
        "overlaps": sum(s.overlap for s in seen),
        "late outcomes": sum(s.late for s in seen),
        "s to settle after restore (max)": round(max(settle), 1),
        **log_counts(folder),
    }


def partition_row(folder: Path) -> dict[str, Any]:
    rig = Rig(folder, beat_direct=True)
    try:
        rig.spawn("a", count=1)
        ids = rig.start([{"sleep": 5, "first_sleep": 100, "fenced": True}] * 2)
        if not wait_until(lambda: all(rig.begins(i) for i in ids), 120):
            raise RuntimeError("partition: the bodies did not start on worker A")
        holders = [rig.client.engine.get(i).step("b").holder or "" for i in ids]
        rig.spawn("b", direct=True, count=1)
        cut_id, cut_at = rig.top_id(), time.monotonic()
        rig.proxy.cut(90)
        rig.wait_terminal(ids, 400)
        stopped, stop_s, elsewhere_s, refused = 0, [], [], 0
        for i in ids:
            marks = rig.marks_of(i)
            first = [m for m in marks if m.detail == "attempt=1"]
            later = [m for m in marks if m.detail != "attempt=1"]
            if first and later and first[-1].id < later[0].id and first[-1].direction != "forward":
                stopped += 1
                stop_s.append((rig.time_of(first[-1].id) or cut_at) - cut_at)
                elsewhere_s.append((rig.time_of(later[0].id) or cut_at) - cut_at)
            refused += not rig.client.fenced_write(first[0].key, 1, "stale write of attempt 1")
        seen = [look(rig, i, cut_id) for i in ids]
        after = [rig.client.engine.get(i).step("b").holder or "" for i in ids]
    finally:
        rig.close()
    return {
        "row": "partition-90s",
        "runs": len(ids),
        "bodies on the cut-off worker": sum(h.startswith("a0-") for h in holders),
        "stopped before running elsewhere": stopped,
        "s from cut to stop": [round(s, 1) for s in stop_s],
        "s from cut to run elsewhere": [round(s, 1) for s in elsewhere_s],
        "ran again on B": sum(h.startswith("b0-") for h in after),
        "overlaps": sum(s.overlap for s in seen),
        "stale fenced writes refused": refused,
        "succeeded recorded failed/lost": sum(s.lost for s in seen),
        "terminal": sum(s.terminal for s in seen),
        **log_counts(folder),
    }


def kill_row(name: str, folder: Path, samples: int) -> dict[str, Any]:
    rig = Rig(folder)
    delays, seen = [], []
    try:
        rig.spawn("w")
        for sample in range(samples):
            [run] = rig.start([{"sleep": 3, "first_sleep": 90}])
            wait_until(lambda run=run: rig.begins(run), 120)
            began = rig.time_of(rig.begins(run)[0].id) or time.monotonic()
            node, pid, _ = (rig.client.engine.get(run).step("b").holder or "").rsplit("/", 2)
            killed_at = time.monotonic()
            if name == "kill-pool":
                os.kill(int(pid), signal.SIGKILL)
            else:
                os.killpg(rig.nodes[node.split("-")[0]].pid, signal.SIGKILL)
            again = wait_until(lambda run=run: len(rig.begins(run)) > 1, 180)
            delays.append(((again or time.monotonic()) - killed_at, killed_at - began))
            if name == "kill-worker":  # a fresh worker in its place
                rig.spawn(f"r{sample}", count=1)
            rig.wait_terminal([run], 120)
            seen.append(look(rig, run, 0))
    finally:
        rig.close()
    return {
        "row": name,
        "samples": samples,
        "s from kill to running again": [round(d, 1) for d, _ in delays],
        "s the body had run when killed": [round(b, 1) for _, b in delays],
        "completed": sum(s.terminal and not s.unwound for s in seen),
        "overlaps": sum(s.overlap for s in seen),
        **log_counts(folder),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(ROWS))
    parser.add_argument("--rounds", type=int, default=None, help="cuts per cut row")
    parser.add_argument("--samples", type=int, default=3, help="kills per kill row")
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="saga-failover-"))
    print(f"logs in {logs}", flush=True)
    rows = []
    for name in args.faults.split(","):
        folder = logs / name
        folder.mkdir(parents=True, exist_ok=True)
        if name.startswith("cut-"):
            rows.append(cut_row(name, folder, args.rounds))
        elif name.startswith("partition"):
            rows.append(partition_row(folder))
        else:
            rows.append(kill_row(name, folder, args.samples))
        print(rows[-1], flush=True)
    for row in rows:
        print("| " + " | ".join(f"{k}: {v}" for k, v in row.items()) + " |")


if __name__ == "__main__":
    main()
