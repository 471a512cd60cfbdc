"""A command handed on by a process without a run's version (``celery_saga.command``) is
sealed when a payload codec is configured: its payload and its actor travel in one envelope
that names the run and the command, so a broker client without the key can neither forge
one in anyone's name nor move a captured one to another run. A worker with a codec refuses
one that is not sealed, with one WARNING line naming the run, and does nothing."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_saga import ExecutionState, Saga, SagaEngine
from celery_saga.encryption import AESGCMCodec, new_key
from celery_saga.store import codec as codec_module
from celery_saga.store.codec import use_codec
from celery_saga.worker.publisher import COMMAND_TASK
from celery_saga.worker.saga_header import HEADER
from celery_saga.worker.sealed_commands import UnsealedCommand, open_arguments, seal_arguments
from tests.conftest import PORTS, require_services
from tests.vault_app import charge, release, reserve
from tests.vault_worker import BROKER, ENDED, VaultWorker, vault_worker


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultWorker]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    before = codec_module.current_codec()
    with vault_worker(tmp_path_factory.mktemp("hand-on"), "hand_on") as running:
        yield running
    use_codec(before)


def _waiting_run(engine: SagaEngine) -> str:
    run_id = engine.start("vault_rotate", {"card": "4111111111111111"}).id
    deadline = time.monotonic() + 30
    while engine.get(run_id).state is not ExecutionState.WAITING:
        assert time.monotonic() < deadline, engine.get(run_id).state
        time.sleep(0.2)
    return run_id


def _forge(engine: SagaEngine, worker: VaultWorker, run_id: str, arguments: Any) -> None:
    """What a broker client without the key can send: a well-formed command message."""
    header = {
        "id": run_id,
        "saga": "vault_rotate",
        "v": engine.definition("vault_rotate").hash,
        "store": engine.hand_backs.store,
    }
    engine.app.send_task(
        COMMAND_TASK,
        args=[run_id, "signal", arguments],
        headers={HEADER: header},
        queue=worker.queue,
    )


def _signal_actors(worker: VaultWorker, run_id: str) -> list[str | None]:
    with create_engine(worker.store).connect() as raw:
        rows = raw.execute(
            text("SELECT actor FROM saga_history WHERE execution_id = :id AND kind = 'signalled'"),
            {"id": run_id},
        )
        return [row.actor for row in rows]


def _until_logged(worker: VaultWorker, words: str, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for line in worker.logged().splitlines():
            if words in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"the worker logged no line with {words!r}:\n{worker.logged()[-3000:]}")


def test_a_forged_unsealed_signal_is_refused_and_changes_nothing(worker: VaultWorker) -> None:
    engine = worker.client()
    run_id = _waiting_run(engine)
    forged = base64.b64encode(msgpack.packb({"approved": True})).decode()
    _forge(engine, worker, run_id, {"event": "confirmed", "payload": forged, "actor": "root@ops"})

    line = _until_logged(worker, f"execution {run_id}: a handed-on signal")
    assert "WARNING" in line and "not sealed" in line, line
    assert engine.get(run_id).state is ExecutionState.WAITING, "the forged signal was accepted"
    assert _signal_actors(worker, run_id) == []


def test_a_sealed_signal_from_a_process_without_the_version_carries_its_actor(
    worker: VaultWorker,
) -> None:
    engine = worker.client()
    run_id = _waiting_run(engine)
    newer = _newer_deploy(worker)
    assert newer.signal(run_id, "confirmed", {"by": "web"}, actor="alice@desk") is False
    run = engine.handle(run_id).wait(timeout=30, states=ENDED)
    assert run.state is ExecutionState.COMPLETED, worker.logged()[-3000:]
    assert _signal_actors(worker, run_id) == ["alice@desk"]


def _newer_deploy(worker: VaultWorker) -> SagaEngine:
    """A process with the same keys whose ``vault_rotate`` is another version: it hands on."""
    app = Celery("vault", broker=BROKER, set_as_current=False)
    app.conf.update(
        task_default_queue=worker.queue,
        saga_store_url=worker.store,
        saga_payload_keys=worker.keys,
    )
    engine = SagaEngine(app)
    saga = Saga("vault_rotate").step("reserve", reserve, compensate=release)
    engine.register(
        saga.wait_for("confirmed", timeout=300).step("charge", charge).step("more", charge)
    )
    return engine


# -- the envelope, without services ----------------------------------------------------
@pytest.fixture
def keyed() -> Iterator[AESGCMCodec]:
    before = codec_module.current_codec()
    codec = AESGCMCodec({"k1": new_key()})
    use_codec(codec)
    yield codec
    use_codec(before)


def test_sealed_arguments_open_only_for_their_run_and_command(keyed: AESGCMCodec) -> None:
    arguments = {"event": "ok", "payload": "", "actor": "alice@desk"}
    sealed = seal_arguments("run-a", "signal", arguments)
    assert set(sealed) == {"sealed"} and "alice" not in str(sealed)
    assert open_arguments("run-a", "signal", sealed) == arguments
    with pytest.raises(UnsealedCommand, match="sealed for another run or command"):
        open_arguments("run-b", "signal", sealed)
    with pytest.raises(UnsealedCommand, match="sealed for another run or command"):
        open_arguments("run-a", "resume", sealed)
    altered = base64.b64decode(sealed["sealed"])
    altered = altered[:-1] + bytes([altered[-1] ^ 1])
    with pytest.raises(UnsealedCommand, match="does not open"):
        open_arguments("run-a", "signal", {"sealed": base64.b64encode(altered).decode()})


def test_with_a_codec_unsealed_arguments_are_refused(keyed: AESGCMCodec) -> None:
    with pytest.raises(UnsealedCommand, match="not sealed"):
        open_arguments("run-a", "resume", {"actor": "root@ops"})
    plain = base64.b64encode(msgpack.packb({"id": "run-a"})).decode()
    with pytest.raises(UnsealedCommand, match="not sealed"):
        open_arguments("run-a", "resume", {"sealed": plain})
    with pytest.raises(UnsealedCommand, match="not sealed"):
        open_arguments("run-a", "resume", {"sealed": "not base64 at all!"})


def test_without_a_codec_arguments_travel_as_they_are() -> None:
    before = codec_module.current_codec()
    use_codec(None)
    try:
        arguments = {"actor": "alice@desk"}
        assert seal_arguments("run-a", "resume", arguments) == arguments
        assert open_arguments("run-a", "resume", arguments) == arguments
    finally:
        use_codec(before)
