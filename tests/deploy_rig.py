"""Real ``celery worker`` processes with chosen versions of the sagas in
``tests/versioned_app.py``, for the rolling-deploy tests and benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import select, text

from celery_saga import ExecutionState
from tests.versioned_app import ledger, make_app

ROOT = Path(__file__).resolve().parent.parent
DONE = (ExecutionState.COMPLETED, ExecutionState.FAILED)


class DeployRig:
    """Workers by version set; ``clients[versions]`` is an engine with those versions."""

    def __init__(self, broker: str, store: str, tmp: Path) -> None:
        self.queue = f"saga-deploy-{uuid.uuid4().hex[:10]}"
        self.broker, self.store, self.tmp = broker, store, tmp
        self.clients = {v: make_app(broker, store, self.queue, v) for v in ("1", "1,2", "2")}
        self.client = self.clients["1,2"]
        self.client.ensure_schema()
        self._forget_earlier_runs()
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def start_worker(self, name: str, versions: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "SAGA_TEST_BROKER": self.broker,
            "SAGA_TEST_STORE": self.store,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_VERSIONS": versions,
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, "-m", "celery", "-A", "tests.versioned_app:app", "worker"]
        command += ["-P", "prefork", "-c", "2", "--prefetch-multiplier", "1", "-Q", self.queue]
        command += ["-n", f"{name}-{self.queue}@%h", "--without-gossip", "--without-mingle"]
        command += ["-l", "INFO"]
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        worker = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers[name] = worker
        destination = [f"{name}-{self.queue}@{os.uname().nodename}"]
        deadline = time.monotonic() + 60
        while not self.client.app.control.ping(destination=destination, timeout=1.0):
            assert worker.poll() is None, self.log(name)
            assert time.monotonic() < deadline, "worker did not start"
        return worker

    def stop_worker(self, name: str) -> None:
        """A warm shutdown (SIGTERM to the main process), as a deploy's stop sends."""
        worker = self.workers.pop(name)
        worker.terminate()
        worker.wait(timeout=60)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def start(self, versions: str, count: int, **data: Any) -> list[str]:
        engine = self.clients[versions]
        return [engine.start("deploy", dict(data, n=i)).id for i in range(count)]

    def signal_parked(self, ids: Iterable[str], signalled: set[str], by: str = "1,2") -> None:
        """Signal the runs parked at their gate from a process with the versions ``by``."""
        for execution_id in ids:
            if execution_id in signalled:
                continue
            execution = self.client.get(execution_id)
            if execution.state is ExecutionState.WAITING:
                self.clients[by].signal(execution_id, "approved")
                signalled.add(execution_id)

    def drive(
        self,
        ids: list[str],
        timeout: float,
        during: Callable[[], None] = lambda: None,
        signal_by: str = "1,2",
    ) -> dict[str, Any]:
        """Signal each run as it parks at its gate until every run has ended."""
        signalled: set[str] = set()
        deadline = time.monotonic() + timeout
        while True:
            during()
            self.signal_parked(ids, signalled, signal_by)
            ended = {i: self.client.get(i) for i in ids}
            if all(e.state in DONE for e in ended.values()):
                return ended
            assert time.monotonic() < deadline, {
                i: e.state.value for i, e in ended.items() if e.state not in DONE
            }
            time.sleep(0.3)

    def ledger_keys(self) -> Counter[str]:
        with self.client.db.engine.connect() as connection:
            rows = connection.execute(select(ledger.c.key)).all()
        return Counter(r[0] for r in rows)

    def ledger_code(self, execution_id: str, step: str) -> list[str]:
        with self.client.db.engine.connect() as connection:
            rows = connection.execute(
                select(ledger.c.code).where(
                    ledger.c.execution_id == execution_id,
                    ledger.c.step == step,
                    ledger.c.direction == "forward",
                )
            ).all()
        return [r[0] for r in rows]

    def close(self) -> None:
        for name in list(self.workers):
            worker = self.workers.pop(name)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        with self.client.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(self.queue)

    def _forget_earlier_runs(self) -> None:
        """This rig's sagas start from nothing (live-run counts are exact)."""
        names = {"names": ["deploy", "approve", "pay", "rollout"]}
        with self.client.db.engine.begin() as connection:
            for table in ("saga_executions", "saga_versions"):
                statement = f"DELETE FROM {table} WHERE saga_name = ANY(:names)"
                connection.execute(text(statement), names)
            connection.execute(text("TRUNCATE test_version_ledger"))
