"""Real sagas through a real PgBouncer in transaction pooling mode (many hosts, one server).

Transaction pooling hands a server connection to a client for one transaction only, so the
store must keep no session state (no session-level SET, no session advisory lock) and must
not rely on prepared statements the pooler cannot follow. The pooler here allows fewer
server connections than the workers open client connections, so transactions of different
processes really do share server connections. Steps, reversals, a parallel group, a worker
killed mid-step and beat's sweeps all run through it; the ledger of effects goes straight to
PostgreSQL and shows every effect exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState, RollbackStatus
from tests.conftest import (
    BROKERS,
    PG_DATABASE,
    PORTS,
    _spawn_workers,
    _test_database_url,
    _wait_ready,
    require_services,
    spawn_beat,
    stop_workers,
)
from tests.faults import free_port
from tests.sagaapp import TestApp

LEASE = 3.0
#: Fewer server connections than the workers' client connections: they must share.
SERVER_CONNECTIONS = 3


def _pgbouncer_binary() -> str:
    # Debian installs it in sbin, outside an ordinary user's PATH.
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    binary = shutil.which("pgbouncer", path=search)
    if binary is None:
        message = "the pgbouncer binary is not installed (Debian package: pgbouncer)"
        if os.environ.get("SAGA_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " and SAGA_REQUIRE_SERVICES=1")
        pytest.skip(message)
    return binary


def _start_pgbouncer(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary, port = _pgbouncer_binary(), free_port()
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"saga = host=127.0.0.1 port={PORTS['postgres']} dbname={PG_DATABASE} user=postgres"
        f" max_db_connections={SERVER_CONNECTIONS}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    command = [binary, str(config)]
    if os.geteuid() == 0:  # it refuses to run as root
        command[1:1] = ["-u", "postgres"]
    log = open(folder / "pgbouncer.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert process.poll() is None, (folder / "pgbouncer.log").read_text(errors="replace")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("pgbouncer did not listen within 15 s")


@dataclass
class PooledRig:
    client: TestApp
    env: dict[str, str]
    folder: Path
    workers: list[subprocess.Popen[bytes]]

    def start_workers(self, count: int) -> list[subprocess.Popen[bytes]]:
        logdir = self.folder / f"gen{len(self.workers)}"
        logdir.mkdir()
        workers, _ = _spawn_workers(self.env, self.env["SAGA_TEST_QUEUE"], logdir, count)
        self.workers.extend(workers)
        _wait_ready(self.client, count, workers)
        return workers

    def finish(self, execution_id: str, timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            execution = self.client.engine.get(execution_id)
            if execution.state in (ExecutionState.COMPLETED, ExecutionState.FAILED):
                return execution
            time.sleep(0.2)
        logs = (self.folder / "pgbouncer.log").read_text(errors="replace")[-2000:]
        raise AssertionError(f"run {execution_id} did not finish: {execution}\n{logs}")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PooledRig]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    direct = _test_database_url()  # creates the test database when missing
    bouncer, port = _start_pgbouncer(tmp_path)
    # PgBouncer before 1.21 cannot follow protocol-level prepared statements.
    pooled = f"postgresql+psycopg://postgres@127.0.0.1:{port}/saga?prepare_threshold=none"
    queue = f"saga-pgbouncer-{uuid.uuid4().hex[:10]}"
    broker = BROKERS["postgres-rabbitmq"]
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": broker,
        "SAGA_TEST_STORE": pooled,
        "SAGA_TEST_LEDGER": direct,
        "SAGA_TEST_QUEUE": queue,
        "SAGA_TEST_DUPLICATE": "0",
        "SAGA_TEST_LEASE": str(LEASE),
        "SAGA_TEST_RECOVER_AFTER": str(LEASE),
        "SAGA_TEST_SWEEP_INTERVAL": "1",
        "PYTHONPATH": str(Path.cwd()),
    }
    monkeypatch.setenv("SAGA_TEST_LEDGER", direct)
    monkeypatch.setenv("SAGA_TEST_LEASE", str(LEASE))
    client = TestApp(broker, pooled, queue)
    client.engine.ensure_schema()  # the migration lock is transaction-scoped: fine here
    beat = spawn_beat(env, tmp_path)
    pooled_rig = PooledRig(client, env, tmp_path, [])
    try:
        yield pooled_rig
    finally:
        stop_workers([*pooled_rig.workers, beat])
        with client.app.connection_for_write() as connection:
            connection.default_channel.queue_purge(queue)
        client.engine.db.dispose()
        bouncer.send_signal(signal.SIGTERM)
        bouncer.wait(timeout=10)


def test_sagas_and_unwinds_run_exactly_once_through_transaction_pooling(rig: PooledRig) -> None:
    rig.start_workers(2)
    happy = [rig.client.engine.start("five", {"order": n}) for n in range(12)]
    fanned = rig.client.engine.start("fanout", {"order": 20})
    failing = rig.client.engine.start("five", {"order": 21, "plan": {"s4": {"fail": True}}})
    for run in happy:
        assert rig.finish(run.id).state is ExecutionState.COMPLETED
        forward = Counter(e.key for e in rig.client.entries(run.id))
        assert forward == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
    assert rig.finish(fanned.id).state is ExecutionState.COMPLETED
    unwound = rig.finish(failing.id)
    assert unwound.rollback_status is RollbackStatus.COMPLETED
    undone = [e.step for e in rig.client.entries(failing.id) if e.direction == "compensate"]
    assert undone == ["s3", "s2", "s1"]
    log = (rig.folder / "pgbouncer.log").read_text(errors="replace")
    assert "prepared statement" not in log


def test_a_worker_killed_mid_step_is_recovered_through_the_pooler(rig: PooledRig) -> None:
    (first,) = rig.start_workers(1)
    run = rig.client.engine.start("five", {"order": 30, "plan": {"s3": {"first_sleep": 6}}})
    deadline = time.monotonic() + 30
    while not any(s.name == "s3" and s.status.value == "running" for s in run.get().steps):
        assert time.monotonic() < deadline, "s3 never started"
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # a lost host: its lease lapses, beat recovers
    first.wait(timeout=10)
    rig.start_workers(1)
    execution = rig.finish(run.id)
    assert execution.state is ExecutionState.COMPLETED
    forward = Counter(e.key for e in rig.client.entries(run.id) if e.direction == "forward")
    assert forward == {f"{run.id}:s{n}:0:forward": 1 for n in range(1, 6)}
    assert execution.step("s3").attempts == 2
