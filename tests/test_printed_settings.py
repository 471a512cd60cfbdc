"""What Celery prints of the app's settings (``celery report``, ``celery inspect conf`` and
so Flower's worker page) gives away neither a payload key nor the store's password: Celery's
own censor recurses into ``saga_payload_keys`` and tests the key ids, and no pattern of its
matches ``saga_store_url``. The worker still runs sagas and opens sealed payloads."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_saga import ExecutionState, SagaEngine
from celery_saga.encryption import PayloadKeys, codec_from_conf, new_key
from celery_saga.store import codec as codec_module
from celery_saga.store.codec import use_codec
from celery_saga.worker.shown_settings import printable
from tests.conftest import PORTS, require_services
from tests.vault_worker import ENDED, PASSWORD, VaultWorker, vault_worker

SECRET_URL = f"postgresql+psycopg://saga:{PASSWORD}@db.internal:5432/saga"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultWorker]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    before = codec_module.current_codec()
    with vault_worker(tmp_path_factory.mktemp("printed"), "printed") as running:
        yield running
    use_codec(before)


def _assert_hidden(printed: str, worker: VaultWorker) -> None:
    for key in worker.keys.values():
        assert key not in printed, "a payload key is printed"
    assert PASSWORD not in printed, "the store's password is printed"


def test_celery_report_prints_neither_a_payload_key_nor_the_store_password(
    worker: VaultWorker,
) -> None:
    report = worker.celery("report")
    assert report.returncode == 0, report.stderr
    assert "saga_store_url" in report.stdout and "saga_payload_keys" in report.stdout
    _assert_hidden(report.stdout + report.stderr, worker)
    assert worker.store.replace(PASSWORD, "***") in report.stdout, "the rest of the URL shows"


def test_inspect_conf_of_a_real_worker_prints_neither_a_key_nor_the_password(
    worker: VaultWorker,
) -> None:
    inspected = worker.celery("inspect", "conf", "--json", "-d", worker.name, "-t", "10")
    assert inspected.returncode == 0, inspected.stderr
    conf = json.loads(inspected.stdout)[worker.name]
    _assert_hidden(inspected.stdout, worker)
    assert conf["saga_store_url"] == worker.store.replace(PASSWORD, "***")
    assert conf["saga_payload_keys"] == "PayloadKeys('k1')", "the ids show, never a key"
    # The same reply as Flower's worker page asks for, through the client's own control.
    replies = worker.client().app.control.inspect([worker.name], timeout=10).conf() or {}
    _assert_hidden(json.dumps(replies), worker)


def test_the_worker_still_runs_sagas_and_opens_sealed_payloads(worker: VaultWorker) -> None:
    engine = worker.client()
    handle = engine.start("vault_rotate", {"card": "4111111111111111"})
    deadline = time.monotonic() + 30
    while engine.get(handle.id).state is not ExecutionState.WAITING:
        assert time.monotonic() < deadline, engine.get(handle.id).state
        time.sleep(0.2)
    engine.signal(handle.id, "confirmed", {"by": "test"})
    run = handle.wait(timeout=30, states=ENDED)
    assert run.state is ExecutionState.COMPLETED
    assert run.results["charge"] == "charged 4111111111111111"
    with create_engine(worker.store).connect() as raw:
        stored = raw.execute(
            text("SELECT input FROM saga_executions WHERE id = :id"), {"id": handle.id}
        ).scalar_one()
    assert b"4111111111111111" not in stored and b"k1" in stored[:8], "sealed with key k1"


# -- the pieces, without services ------------------------------------------------------
def test_payload_keys_show_their_ids_and_never_a_key() -> None:
    key = new_key()
    keys = PayloadKeys({"2026-12": key})
    for shown in (repr(keys), str(keys), f"{keys!r}", json.dumps({"k": str(keys)})):
        assert key not in shown and "2026-12" in shown
    assert keys.ids == ("2026-12",)
    assert codec_from_conf({"saga_payload_keys": keys}).key_ids == ("2026-12",)  # type: ignore[union-attr]


def test_payload_keys_read_from_named_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = new_key()
    monkeypatch.setenv("SAGA_KEY_TEST", key)
    keys = PayloadKeys.from_environment({"2026-12": "SAGA_KEY_TEST"})
    assert key not in repr(keys)
    codec = codec_from_conf({"saga_payload_keys": keys})
    assert codec is not None and codec.open(*codec.seal(b"x")) == b"x"
    monkeypatch.delenv("SAGA_KEY_TEST")
    with pytest.raises(ValueError, match=r"environment variable 'SAGA_KEY_TEST'.*'2026-12'"):
        PayloadKeys.from_environment({"2026-12": "SAGA_KEY_TEST"})


@pytest.mark.parametrize(
    ("setting", "value", "shown"),
    [
        ("saga_store_url", SECRET_URL, "postgresql+psycopg://saga:***@db.internal:5432/saga"),
        (
            "saga_store_url",
            f"postgresql://db.internal/saga?user=saga&password={PASSWORD}",
            "postgresql://db.internal/saga?password=***&user=saga",
        ),
        ("saga_store_url", "not a url :: " + PASSWORD, "<unparsable url>"),
        ("saga_read_store_url", SECRET_URL, "postgresql+psycopg://saga:***@db.internal:5432/saga"),
        ("saga_payload_keys", {"k1": "material"}, "PayloadKeys('k1')"),
        ("saga_payload_keys", PayloadKeys({"k1": new_key()}), "PayloadKeys('k1')"),
        ("saga_queue", "sagas", "sagas"),
    ],
    # Fixed ids: the password is random, and every test process must collect the same ids.
    ids=[
        "url-user-part",
        "url-query",
        "unparsable-url",
        "read-url",
        "keys-mapping",
        "keys",
        "other",
    ],
)
def test_printable_hides_what_celery_misses(setting: str, value: object, shown: str) -> None:
    assert printable({setting: value, "broker_url": "amqp://"}) == {
        setting: shown,
        "broker_url": "amqp://",
    }


def test_an_app_with_an_engine_prints_no_secret_in_its_settings(tmp_path: Path) -> None:
    """Old configurations (a plain mapping of keys) keep working and are hidden too."""
    key = new_key()
    app = Celery("printed", broker="memory://localhost/", set_as_current=False)
    app.conf.update(saga_payload_keys={"k1": key}, saga_store_url=f"sqlite:///{tmp_path}/s.db")
    before = codec_module.current_codec()
    try:
        SagaEngine(app)
    finally:
        use_codec(before)
    table = json.dumps(app.conf.table(), default=repr)
    for printed in (app.conf.humanize(), app.bugreport(), table):
        assert key not in printed
    assert app.conf.saga_payload_keys == {"k1": key}, "the setting itself is left as given"
    assert key in repr(app.conf.table(censored=False)), "an explicit uncensored table stays so"
