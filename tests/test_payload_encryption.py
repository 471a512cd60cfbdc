"""Payloads encrypted at rest (``saga_payload_keys``): sealed before they reach the store and
opened when read, on every node kind, with key ids beside each payload so keys rotate
without rewriting history; a payload whose key is missing names the key."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import inspect, select, text

from celery_saga import ExecutionState, PayloadKeyError, Saga, SagaContext, step
from celery_saga.cli.commands import saga as saga_cli
from celery_saga.definition.builder import path
from celery_saga.encryption import AESGCMCodec, codec_from_conf, new_key
from celery_saga.store import codec as codec_module
from celery_saga.store.codec import pack, sealed_key, unpack, use_codec
from celery_saga.store.database import Database
from celery_saga.store.reseal import reseal_all
from celery_saga.store.tables import executions
from tests.conftest import (
    PORTS,
    fresh_mariadb_database,
    fresh_pg_database,
    in_process_pg_engine,
    require_services,
)

SECRET = "4111-SECRET-" + uuid.uuid4().hex[:8]
KEY_1, KEY_2 = new_key(), new_key()


@pytest.fixture(autouse=True)
def _process_codec() -> Iterator[None]:
    """The codec is the process's: give back the one other tests run with."""
    before = codec_module.current_codec()
    yield
    use_codec(before)


# -- the envelope ------------------------------------------------------------------------


def test_a_sealed_payload_round_trips_every_type_and_holds_no_plaintext() -> None:
    use_codec(AESGCMCodec({"k1": KEY_1}))
    value = {
        "card": SECRET,
        "when": dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.timezone.utc),
        "amount": Decimal("12.30"),
        "raw": SECRET.encode(),
        "lines": [1, 2.5, None, True],
    }
    stored = pack(value)
    assert SECRET.encode() not in stored
    assert sealed_key(stored) == "k1"
    assert unpack(stored) == value
    assert pack(value) != stored  # a fresh nonce each time


def test_plain_payloads_written_before_the_codec_still_read() -> None:
    use_codec(None)
    plain = pack({"card": SECRET})
    assert sealed_key(plain) is None
    use_codec(AESGCMCodec({"k1": KEY_1}))
    assert unpack(plain) == {"card": SECRET}


def test_a_payload_whose_key_is_missing_names_the_key() -> None:
    use_codec(AESGCMCodec({"old": KEY_1}))
    stored = pack({"card": SECRET})
    use_codec(AESGCMCodec({"new": KEY_2}))
    with pytest.raises(PayloadKeyError, match="'old'") as missing:
        unpack(stored)
    assert missing.value.key_id == "old"
    use_codec(None)
    with pytest.raises(PayloadKeyError, match=r"key .old..*no payload codec"):
        unpack(stored)


def test_a_key_id_given_other_key_material_is_refused_not_read_as_garbage() -> None:
    use_codec(AESGCMCodec({"k1": KEY_1}))
    stored = pack("value")
    use_codec(AESGCMCodec({"k1": KEY_2}))
    with pytest.raises(PayloadKeyError, match="does not open with the key configured"):
        unpack(stored)


def test_a_sealed_payload_changed_in_the_store_does_not_open() -> None:
    """Someone who can write the store but holds no key cannot alter a payload unseen."""
    use_codec(AESGCMCodec({"k1": KEY_1}))
    stored = pack({"amount": 100})
    for at in (len(stored) // 2, len(stored) - 1):
        altered = stored[:at] + bytes([stored[at] ^ 1]) + stored[at + 1 :]
        with pytest.raises(PayloadKeyError, match="does not open with the key configured"):
            unpack(altered)
    assert unpack(stored) == {"amount": 100}


def test_the_newest_key_seals_and_every_listed_key_opens() -> None:
    use_codec(AESGCMCodec({"k1": KEY_1}))
    old = pack("a")
    use_codec(codec_from_conf({"saga_payload_keys": {"k1": KEY_1, "k2": KEY_2}}))
    assert sealed_key(pack("b")) == "k2"
    assert unpack(old) == "a"
    chosen = {"saga_payload_keys": {"k1": KEY_1, "k2": KEY_2}, "saga_payload_key": "k1"}
    use_codec(codec_from_conf(chosen))
    assert sealed_key(pack("c")) == "k1"


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"saga_payload_keys": {"k1": "not base64!"}}, "not URL-safe base64"),
        ({"saga_payload_keys": {"k1": "c2hvcnQ="}}, "is 5 bytes"),
        ({"saga_payload_keys": {"k1": KEY_1}, "saga_payload_key": "k9"}, "'k9' is not among"),
        ({"saga_payload_keys": {"": KEY_1}}, "key id ''"),
        ({"saga_payload_keys": {"k1": KEY_1}, "saga_payload_codec": "x:y"}, "not both"),
        ({"saga_payload_codec": "json"}, "'module:attribute'"),
    ],
)
def test_bad_codec_settings_are_refused_with_what_is_wrong(
    conf: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        codec_from_conf(conf)


def test_a_codec_named_by_its_import_path_is_used() -> None:
    codec = codec_from_conf({"saga_payload_codec": f"{__name__}:named_codec"})
    assert codec is not None and codec.key_ids == ("named",)


def named_codec() -> AESGCMCodec:
    return AESGCMCodec({"named": KEY_1})


# -- every node kind, every table ----------------------------------------------------------


def _reserve(ctx: SagaContext) -> dict[str, Any]:
    return {"token": ctx.input["card"], "amount": Decimal("9.99")}


def _charge(ctx: SagaContext) -> str:
    return f"charged {ctx.input['card']}"


def _pick(ctx: SagaContext) -> str:
    return f"picked {ctx.item}"


def _fail_if_asked(ctx: SagaContext) -> str:
    if ctx.input.get("fail"):
        raise RuntimeError(f"the carrier refused the parcel paid by {ctx.input['card']}")
    return "shipped " + ctx.signals["paid"]["card"]


def _undo(ctx: SagaContext) -> None:
    return None


def _child(ctx: SagaContext) -> str:
    return "child saw " + ctx.input["card"]


def _sagas(marks: Any = ()) -> list[Saga]:
    child = Saga("vault_child", sensitive=marks).step("remember", _child, compensate=_undo)
    parent = (
        Saga("vault_parent", sensitive=marks)
        .step("reserve", _reserve, compensate=_undo)
        .parallel("both", step("charge", _charge, compensate=_undo), step("note", _charge))
        .branch(
            "route",
            lambda ctx: "card" if ctx.input["card"] else "cash",
            path("card", step("card_path", _charge, compensate=_undo)),
            path("cash", step("cash_path", _charge)),
        )
        .map("summary", lambda ctx: {"secret": ctx.input["card"], "n": 2})
        .for_each(lambda ctx: ctx.input["items"], step(_pick, compensate=_undo))
        .sub_saga("vault_child")
        .wait_for("paid", timeout=120)
        .step("ship", _fail_if_asked, compensate=_undo)
    )
    return [child, parent]


def _plaintext_cells(db: Database) -> list[str]:
    """Every (table.column) holding the secret in any row: text and bytes alike."""
    found = []
    names = inspect(db.engine).get_table_names()
    with db.engine.connect() as connection:
        for table in names:
            for row in connection.execute(text(f"SELECT * FROM {table}")).mappings():
                for column, value in row.items():
                    raw = value if isinstance(value, (bytes, memoryview)) else str(value)
                    probe = bytes(raw) if not isinstance(raw, str) else raw.encode()
                    if SECRET.encode() in probe:
                        found.append(f"{table}.{column}")
    return found


@pytest.fixture(params=["sqlite", "postgres"])
def vault_stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Two fresh stores of one backend: with the codec and marks, and without either."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/vault.sqlite3", f"sqlite:///{tmp_path}/bare.sqlite3"
    require_services(PORTS["postgres"])
    return fresh_pg_database("vault"), fresh_pg_database("bare")


def _drive(engine: Any) -> tuple[list[Any], list[str]]:
    """A run that completes and one that unwinds, each through every node kind: their
    steps' (name, status, result, compensation) and their ids."""
    ids, ends = [], []
    for fail in (False, True):
        saga_input = {"card": SECRET, "items": [SECRET, "b"], "fail": fail}
        run = engine.start("vault_parent", saga_input)
        assert run.wait(60, states={ExecutionState.WAITING}).state is ExecutionState.WAITING
        assert engine.signal(run.id, "paid", {"card": SECRET})
        ids.append(run.id)
    for execution_id in ids:
        done = engine.handle(execution_id).wait(timeout=60)
        steps = [(s.name, s.status, s.result, s.compensation_status) for s in done.steps]
        ends.append((done.state, done.rollback_status, steps))
    return ends, ids


def test_with_the_codec_and_marks_no_marked_value_is_in_any_table_log_or_show_and_runs_end_alike(
    vault_stores: str,
) -> None:
    sealed_store, bare_store = vault_stores
    with in_process_pg_engine("bare", *_sagas(), store_url=bare_store) as engine:
        expected, _ = _drive(engine)
    assert expected[0][0] is ExecutionState.COMPLETED and expected[1][0] is ExecutionState.FAILED
    lines: list[str] = []
    keys = {"saga_payload_keys": {"k1": KEY_1}}

    def marks(_path: tuple[str | int, ...], value: Any) -> bool:
        return isinstance(value, str) and SECRET in value  # the card, and all it is part of

    engine_context = in_process_pg_engine("vault", *_sagas(marks), store_url=sealed_store, **keys)
    with engine_context as engine, _logged(lines):  # after the worker set its logging up
        ends, ids = _drive(engine)
        assert ends == expected  # what ran, its results and its unwind: as without either
        assert "carrier refused" in (engine.get(ids[1]).failure_reason or "")
        assert _plaintext_cells(engine.db) == []
        with engine.db.engine.connect() as connection:
            stored = connection.execute(
                select(executions.c.input).where(executions.c.id == ids[0])
            ).scalar_one()
        assert sealed_key(stored) == "k1"
        shown = [
            _show(engine, execution_id, *how) for execution_id in ids for how in ((), ("--json",))
        ]
        assert all(SECRET not in output for output in shown)
        assert SECRET in _show(engine, ids[1], "--json", "--reveal")
        deadline = time.monotonic() + 10  # Celery logs a task's end after its outcome is stored
        while not any("raised unexpected" in line for line in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
    assert not [line for line in lines if SECRET in line]


def _show(engine: Any, execution_id: str, *options: str) -> str:
    obj = SimpleNamespace(app=engine.app)
    result = CliRunner().invoke(saga_cli, ["show", execution_id, *options], obj=obj)
    assert result.exit_code == 0, result.output
    return result.output


@contextmanager
def _logged(lines: list[str]) -> Iterator[None]:
    """Every line the engine and Celery log meanwhile, tracebacks included."""
    handler = logging.Handler(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in ("", "celery_saga")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


# -- a worker without the key ---------------------------------------------------------------


def test_a_worker_without_the_key_names_it_and_sends_the_message_again_not_failing_the_run(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/keys.sqlite3"
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]
    logging.getLogger("celery_saga").addHandler(handler)
    saga = Saga("vault_keyless").step("reserve", _reserve, compensate=_undo)
    with in_process_pg_engine(
        "vault-keyless", saga, store_url=store, saga_payload_keys={"k2": KEY_2}
    ) as engine:
        use_codec(AESGCMCodec({"k1": KEY_1}))  # a producer on the old key
        run = engine.start("vault_keyless", {"card": SECRET})
        use_codec(AESGCMCodec({"k2": KEY_2}))  # the worker's settings lack it
        deadline = time.monotonic() + 20
        while not any("key 'k1'" in r.getMessage() for r in lines):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        logging.getLogger("celery_saga").removeHandler(handler)
        line = next(r for r in lines if "key 'k1'" in r.getMessage())
        assert line.levelname == "ERROR" and "sent again in 15 s" in line.getMessage()
        assert not any(SECRET in r.getMessage() for r in lines)
        use_codec(AESGCMCodec({"k1": KEY_1, "k2": KEY_2}))  # the settings are mended
        assert engine.get(run.id).state is ExecutionState.RUNNING
        done = run.wait(timeout=40)
        assert done.state is ExecutionState.COMPLETED
        assert done.results["reserve"]["token"] == SECRET


# -- reencrypt on every backend ---------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def own_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store no other test reads: reencrypt walks every row of it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/reseal.sqlite3"
    if request.param == "postgres":
        require_services(PORTS["postgres"])
        return fresh_pg_database("reseal")
    return fresh_mariadb_database("reseal")


def test_reencrypt_moves_plain_and_old_payloads_to_the_newest_key_and_names_what_it_cannot_open(
    own_store: str,
) -> None:
    from celery_saga import SagaEngine
    from tests.conftest import unconsumed_app

    engine = SagaEngine(unconsumed_app("reseal"), store_url=own_store)
    engine.register(Saga("vault_reseal").step("reserve", _reserve))
    engine.ensure_schema()
    written = {}
    for key_id, codec in (
        ("plain", None),
        ("k1", AESGCMCodec({"k1": KEY_1})),
        ("stranger", AESGCMCodec({"stranger": new_key()})),
        ("k2", AESGCMCodec({"k2": KEY_2})),
    ):
        use_codec(codec)
        written[key_id] = [
            engine.start("vault_reseal", {"card": f"{key_id}-{n}"}).id for n in range(7)
        ]
    rotating = AESGCMCodec({"k1": KEY_1, "k2": KEY_2}, current="k2")
    counts = reseal_all(engine.db, rotating, "k2", batch_size=3)
    runs = next(c for c in counts if c.table == "saga_executions")
    assert (runs.resealed, runs.current, runs.unreadable) == (14, 7, {"stranger": 7})
    assert runs.keys_met == {"(plain)": 7, "k1": 7, "stranger": 7, "k2": 7}
    use_codec(AESGCMCodec({"k2": KEY_2}))  # the old key removed
    for key_id in ("plain", "k1", "k2"):
        for n, execution_id in enumerate(written[key_id]):
            assert engine.get(execution_id).record.input == {"card": f"{key_id}-{n}"}
    with pytest.raises(PayloadKeyError, match="'stranger'"):
        engine.get(written["stranger"][0])
    assert reseal_all(engine.db, rotating, "k2")[0].resealed == 0  # nothing left to do
    engine.db.dispose()
