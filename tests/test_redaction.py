"""Values a saga marks sensitive stay out of everything a human reads: the stored failure
texts, the engine's and Celery's log lines, saga events, Celery's task results, and
`celery saga show` (unless asked with --reveal); the run fails and unwinds exactly as the
same saga without markings does."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from celery_saga import ExecutionState, RollbackStatus, Saga, path, step
from celery_saga.cli import saga as saga_cli
from celery_saga.redaction import REDACTED
from celery_saga.store.tables import metadata as saga_metadata
from tests.conftest import Harness, in_process_pg_engine
from tests.redaction_sagas import token_of

CARD = "4111-2222-3333-4444"
ADDRESS = "12 Hidden Lane"


def _input(order: int) -> dict[str, Any]:
    return {"order": order, "card": CARD, "address": ADDRESS}


def _secrets(order: int) -> list[str]:
    return [CARD, ADDRESS, token_of(order)]


def _stored_texts(harness: Any) -> list[str]:
    """Every text value of every saga table (payload blobs are the codec's concern)."""
    texts = []
    for table in saga_metadata.sorted_tables:
        for row in harness.engine.db.read(select(table)):
            texts.extend(v for v in row.values() if isinstance(v, str))
    return texts


def _show(harness: Harness, *args: str) -> str:
    obj = SimpleNamespace(app=harness.test_app.app)
    result = CliRunner().invoke(saga_cli, ["show", *args], obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _run(harness: Harness, saga: str, order: int) -> Any:
    run = harness.start(saga, _input(order)).wait(60)
    assert run.state is ExecutionState.FAILED, harness.worker_logs()
    assert run.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    return run


def _unwound(harness: Harness, run_id: str) -> list[tuple[str, str]]:
    return [(e.step, e.direction) for e in harness.test_app.entries(run_id)]


@pytest.fixture
def seen(harness: Harness, caplog: pytest.LogCaptureFixture) -> Any:
    """What this process logs (the in-process worker's lines) and the saga events sent."""
    if harness.name == "postgres-redis":
        pytest.skip("one server backend is enough: the broker changes nothing here")
    caplog.set_level(logging.INFO)
    events: list[tuple[str, dict[str, Any]]] = []

    def listener(event: str, fields: dict[str, Any]) -> None:
        events.append((event, dict(fields)))

    harness.engine.events.subscribe("*", listener)
    yield SimpleNamespace(caplog=caplog, events=events)
    harness.engine.events.unsubscribe("*", listener)


def test_marked_values_are_in_no_failure_text_log_event_or_task_result(
    harness: Harness, seen: Any
) -> None:
    order = 7000 + uuid.uuid4().int % 1000
    run = _run(harness, "private", order)
    assert run.failure_reason == (
        f"ValueError: card {REDACTED} at {REDACTED} declined (token {REDACTED})"
    )
    time.sleep(1.0)  # Celery's log lines follow the stored outcome

    texts = _stored_texts(harness)
    logs = "\n".join(
        [harness.worker_logs()]
        + [p.read_text(errors="replace") for p in harness.logs]
        + [seen.caplog.text]
        + [
            logging.Formatter().formatException(record.exc_info)
            for record in seen.caplog.records
            if record.exc_info
        ]
    )
    private_lines = "\n".join(
        line for line in logs.splitlines() if str(order) in line or "private." in line
    )
    assert private_lines, "the run's log lines were not found"
    events = json.dumps([e for e in seen.events if e[1].get("execution_id") == run.id])
    for secret in _secrets(order):
        assert not [t for t in texts if secret in t], secret
        assert secret not in logs, secret
        assert secret not in events, secret
    assert f"card {REDACTED} at {REDACTED}" in logs  # Celery's own line, scrubbed
    assert f"vault refused {REDACTED}" in logs
    if harness.in_process:  # the events of the worker processes are sent from there
        assert f"vault refused {REDACTED}" in events
    if not harness.in_process:
        # The worker processes logged the step task's result as Celery returns, sends
        # (task-succeeded) and stores it: redacted, and the failed task's exception too.
        assert re.search(r"private\.tokenize\[[^\]]+\] succeeded in [\d.]+s: '\[redacted\]'", logs)
        assert re.search(r"private\.charge\[[^\]]+\] raised unexpected: ValueError", logs)
        task_id = re.search(r"private\.tokenize\[([^\]]+)\] succeeded", logs)
        assert task_id is not None
        stored = harness.test_app.app.AsyncResult(task_id.group(1)).get(timeout=10)
        assert stored == REDACTED
        failed = re.search(r"private\.charge\[([^\]]+)\] raised", logs)
        assert failed is not None
        error = harness.test_app.app.AsyncResult(failed.group(1))
        error.get(timeout=10, propagate=False)
        assert repr(error.result) == repr(ValueError(run.failure_reason.split(": ", 1)[1]))

    # The markings change what is shown, never what runs; without them the failure text is
    # kept as raised (so the scrubbing above is the markings' doing).
    plain = _run(harness, "private_plain", order)
    assert (
        _unwound(harness, run.id)
        == _unwound(harness, plain.id)
        == [
            ("reserve", "forward"),
            ("tokenize", "forward"),
            ("charge", "forward"),
            ("tokenize", "compensate_failed"),
            ("tokenize", "compensate"),
            ("reserve", "compensate"),
        ]
    )
    assert CARD in (plain.failure_reason or "")


def test_show_prints_marked_values_redacted_and_reveals_them_when_asked(
    harness: Harness, seen: Any
) -> None:
    order = 8000 + uuid.uuid4().int % 1000
    run = _run(harness, "private", order)
    shown = json.loads(_show(harness, run.id, "--json"))
    assert shown["input"] == {"order": order, "card": REDACTED, "address": REDACTED}
    results = {s["name"]: s["result"] for s in shown["steps"]}
    assert results["reserve"] == {"hold": f"hold-{order}", "card": REDACTED}
    assert results["tokenize"] == REDACTED
    text = _show(harness, run.id)
    for secret in _secrets(order):
        assert secret not in json.dumps(shown) and secret not in text, secret
    assert f"failure_reason: ValueError: card {REDACTED}" in text

    revealed = json.loads(_show(harness, run.id, "--json", "--reveal"))
    assert revealed["input"] == _input(order)
    assert {s["name"]: s["result"] for s in revealed["steps"]}["tokenize"] == {
        "token": token_of(order)
    }


def _route(ctx: Any) -> str:
    raise LookupError(f"no route for card {ctx.input['card']}")


def test_a_choice_that_fails_on_a_marked_value_fails_the_run_with_it_scrubbed() -> None:
    saga = Saga(f"route{uuid.uuid4().hex[:6]}", sensitive=("card",))
    saga.step("reserve", lambda: None, compensate=lambda: None)
    saga.branch("by_card", _route, path("visa", step("visa", lambda: None)))
    with in_process_pg_engine("route", saga) as engine:
        run = engine.start(saga.name, {"card": CARD}).wait(timeout=30)
        stored = _stored_texts(SimpleNamespace(engine=engine))
        texts = [t for t in stored if "no route" in t and repr(saga.name) in t]
    assert run.state is ExecutionState.FAILED
    assert texts and all(CARD not in t for t in texts), texts
    assert f"no route for card {REDACTED}" in (run.failure_reason or "")


_UNSTORABLE = {
    "set": ({"S3CR3T-SET-4111"}, "S3CR3T-SET-4111", "a value of type 'set' at {}; supported"),
    "int": (98765432109876543210987654321, "98765432109876543210987654321", "integer at {} is"),
}


def _unstorable_result(ctx: Any) -> Any:
    return {"card": {"numbers": [_UNSTORABLE[ctx.input["kind"]][0]]}}


@pytest.mark.parametrize("kind", sorted(_UNSTORABLE))
def test_a_marked_value_that_cannot_be_stored_is_named_by_type_and_path_never_shown(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_saga.errors import PayloadError
    from celery_saga.runtime.clock import get_clock
    from celery_saga.store import retention
    from tests.conftest import fresh_pg_database

    _, secret, refusal = _UNSTORABLE[kind]
    saga = Saga(f"unstorable_{kind}", sensitive=("card",)).step("lookup", _unstorable_result)
    caplog.set_level(logging.INFO)
    store = fresh_pg_database(f"unstorable_{kind}")
    with in_process_pg_engine("unstorable", saga, store_url=store) as engine:
        run = engine.start(saga.name, {"kind": kind}).wait(timeout=30)
        assert run.state is ExecutionState.FAILED
        with pytest.raises(PayloadError) as refused:  # an input is refused the same way
            engine.start(saga.name, {"kind": kind, "card": _UNSTORABLE[kind][0]})
        now = get_clock().now()
        retention.retire(engine.db, cutoff=now, now=now, archive=True, rest=0)
        texts = _stored_texts(SimpleNamespace(engine=engine))
    reason = run.failure_reason or ""
    assert refusal.format("card.numbers[0]") in reason, reason
    assert refusal.format("card") in str(refused.value), refused.value
    archived = [t for t in texts if "card.numbers[0]" in t]
    assert len(archived) >= 3, texts  # failure_reason, the step's error, history (archived)
    everything = "\n".join([*texts, reason, str(refused.value), caplog.text])
    assert secret not in everything
