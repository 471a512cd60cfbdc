"""One real ``celery worker`` of ``tests/vault_app.py`` (payload keys configured) on
RabbitMQ and PostgreSQL, for the tests of what its settings and its messages give away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from celery_saga import ExecutionState, SagaEngine
from celery_saga.encryption import new_key
from tests.conftest import BROKERS, ROOT, fresh_pg_database, stop_workers
from tests.vault_app import make_app

BROKER = BROKERS["postgres-rabbitmq"]
#: The store's password: PostgreSQL's trust authentication accepts any, so it only has to
#: stay out of what is printed.
PASSWORD = "Pw-" + uuid.uuid4().hex
#: What ``wait`` waits for once a run has been signalled (waiting is "settled" by default).
ENDED = (ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK)


@dataclass
class VaultWorker:
    """A running worker: its node name, queue, store URL (with ``PASSWORD``), keys, log."""

    name: str
    queue: str
    store: str
    keys: dict[str, str]
    log: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SAGA_TEST_BROKER": BROKER,
            "SAGA_TEST_STORE": self.store,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_PAYLOAD_KEYS": json.dumps(self.keys),
            "SAGA_TEST_PAYLOAD_KEY": list(self.keys)[-1],
            "PYTHONPATH": str(ROOT),
        }

    def client(self) -> SagaEngine:
        """An engine of the same app in this process (same keys, queue and store)."""
        return make_app(BROKER, self.store, self.queue, self.keys, list(self.keys)[-1])

    def celery(self, *words: str) -> subprocess.CompletedProcess[str]:
        """``celery -A tests.vault_app:app <words>`` with the worker's settings."""
        command = [sys.executable, "-m", "celery", "-A", "tests.vault_app:app", *words]
        return subprocess.run(
            command, cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=120
        )

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def vault_worker(tmp: Path, suffix: str) -> Iterator[VaultWorker]:
    """A vault worker on a fresh database ``suffix`` whose URL holds ``PASSWORD``."""
    store = fresh_pg_database(suffix).replace("//postgres@", f"//postgres:{PASSWORD}@", 1)
    queue = f"saga-vault-{uuid.uuid4().hex[:10]}"
    worker = VaultWorker(
        f"vault-{queue}@localhost", queue, store, {"k1": new_key()}, tmp / "vault.log"
    )
    command = [sys.executable, "-m", "celery", "-A", "tests.vault_app:app", "worker"]
    command += ["-P", "prefork", "-c", "1", "-Q", queue, "-n", worker.name, "-l", "INFO"]
    command += ["--without-gossip", "--without-mingle"]
    with open(worker.log, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=worker.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(worker, process)
        yield worker
    finally:
        stop_workers([process])


def _wait_ready(worker: VaultWorker, process: subprocess.Popen[bytes]) -> None:
    app = worker.client().app
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the vault worker exited:\n{worker.logged()[-3000:]}")
        if app.control.ping(destination=[worker.name], timeout=1.0):
            return
    raise RuntimeError("the vault worker did not answer ping within 60 s")
