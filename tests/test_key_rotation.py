"""Key rotation under load (guarantee 33): 200 runs in flight on real workers while the
payload key rotates; all complete; ``celery saga db reencrypt`` moves every old row to the
newest key; a process without the old key names it instead of reading garbage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from celery_saga import ExecutionState, PayloadKeyError, SagaEngine
from celery_saga.encryption import new_key
from celery_saga.store import codec as codec_module
from celery_saga.store.codec import sealed_key, use_codec
from celery_saga.store.reseal import PAYLOAD_COLUMNS
from tests.conftest import PORTS, fresh_pg_database, require_services
from tests.vault_app import make_app

ROOT = Path(__file__).resolve().parent.parent
BROKER = os.environ.get("SAGA_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
RUNS = 200
K1, K2 = new_key(), new_key()


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.queue = f"saga-vault-{uuid.uuid4().hex[:10]}"
        self.store, self.tmp = fresh_pg_database("rotation"), tmp
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def client(self, keys: dict[str, str], newest: str) -> SagaEngine:
        return make_app(BROKER, self.store, self.queue, keys, newest)

    def env(self, keys: dict[str, str], newest: str) -> dict[str, str]:
        return {
            **os.environ,
            "SAGA_TEST_BROKER": BROKER,
            "SAGA_TEST_STORE": self.store,
            "SAGA_TEST_QUEUE": self.queue,
            "SAGA_TEST_PAYLOAD_KEYS": json.dumps(keys),
            "SAGA_TEST_PAYLOAD_KEY": newest,
            "PYTHONPATH": str(ROOT),
        }

    def start_worker(self, name: str, keys: dict[str, str], newest: str) -> None:
        command = [sys.executable, "-m", "celery", "-A", "tests.vault_app:app", "worker"]
        command += ["-P", "prefork", "-c", "2", "-Q", self.queue, "-l", "INFO"]
        command += ["-n", f"{name}-{self.queue}@%h", "--without-gossip", "--without-mingle"]
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.workers[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env(keys, newest),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop_worker(self, name: str) -> None:
        worker = self.workers.pop(name)
        worker.terminate()  # a deploy's warm shutdown
        worker.wait(timeout=60)

    def stop_all(self) -> None:
        for name in list(self.workers):
            self.stop_worker(name)


def _saga_command(rig: Rig, keys: dict[str, str], *words: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "celery", "-A", "tests.vault_app:app", "saga", *words]
    env = rig.env(keys, list(keys)[-1])
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _states(engine: SagaEngine, ids: list[str]) -> Counter[ExecutionState]:
    return Counter(engine.get(i).state for i in ids)


def _until(engine: SagaEngine, ids: list[str], state: ExecutionState, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _states(engine, ids)[state] < len(ids):
        assert time.monotonic() < deadline, _states(engine, ids)
        time.sleep(0.5)


def _keys_in_store(engine: SagaEngine, ids: list[str]) -> Counter[str | None]:
    found: Counter[str | None] = Counter()
    with engine.db.engine.connect() as connection:
        for table, _keys, column in PAYLOAD_COLUMNS:
            if table.name.endswith("_archive"):
                continue
            run = table.c.id if table.name == "saga_executions" else table.c.execution_id
            query = select(table.c[column]).where(run.in_(ids), table.c[column].is_not(None))
            found.update(sealed_key(blob) for blob in connection.execute(query).scalars())
    return found


@pytest.fixture
def rig(tmp_path: Path) -> object:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    before = codec_module.current_codec()
    rig = Rig(tmp_path)
    yield rig
    rig.stop_all()
    use_codec(before)


def test_runs_in_flight_complete_while_the_key_rotates_and_reencrypt_converts_the_rest(
    rig: Rig,
) -> None:
    old = rig.client({"k1": K1}, "k1")
    old.ensure_schema()
    ids = [old.start("vault_rotate", {"card": f"card-{i}"}).id for i in range(RUNS)]
    rig.start_worker("a", {"k1": K1}, "k1")
    _until(old, ids, ExecutionState.WAITING, 120)
    for execution_id in ids[: RUNS // 2]:  # these run while the key rotates
        assert old.signal(execution_id, "confirmed", {"by": "clerk"})

    rig.start_worker("b", {"k1": K1, "k2": K2}, "k2")  # readers of both, writer of k2
    rig.stop_worker("a")
    new = rig.client({"k1": K1, "k2": K2}, "k2")
    for execution_id in ids[RUNS // 2 :]:
        assert new.signal(execution_id, "confirmed", {"by": "clerk"})
    _until(new, ids, ExecutionState.COMPLETED, 180)
    for i, execution_id in enumerate(ids):
        assert new.get(execution_id).results["charge"] == f"charged card-{i}"
    mixed = _keys_in_store(new, ids)
    assert mixed["k1"] and mixed["k2"] and not mixed[None], mixed

    only_new = rig.client({"k2": K2}, "k2")
    with pytest.raises(PayloadKeyError, match="key 'k1'"):
        only_new.get(ids[0])

    # An operator without the old key still sees each run, its payloads named by key.
    shown = _saga_command(rig, {"k2": K2}, "show", ids[0], "--json")
    assert shown.returncode == 0, shown.stderr
    assert "<sealed with key 'k1'>" in shown.stdout and "card-0" not in shown.stdout
    listed = _saga_command(rig, {"k2": K2}, "list", "--saga", "vault_rotate")
    assert listed.returncode == 0 and listed.stdout.count("completed") == 50, listed.stderr

    done = _saga_command(rig, {"k1": K1, "k2": K2}, "db", "reencrypt", "--batch-size", "64")
    assert done.returncode == 0, done.stderr
    assert "saga_executions.input:" in done.stdout and "changed meanwhile" in done.stdout
    assert set(_keys_in_store(new, ids)) == {"k2"}
    for i, execution_id in enumerate(ids):  # the old key is no longer needed
        assert only_new.get(execution_id).results["charge"] == f"charged card-{i}"
