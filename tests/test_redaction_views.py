"""Redaction fails closed in what the views show (PostgreSQL): a sub-saga's values are
redacted by the child's own markings wherever the parent shows them, and a run whose saga
this process does not have shows none of its payloads, nor lets the text search find them,
unless ``show --reveal`` asks."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from celery_saga import ExecutionState, SagaEngine
from celery_saga.cli import saga as saga_cli
from celery_saga.redaction import NOT_REGISTERED, REDACTED
from celery_saga.web import Credentials, WebSettings, create_app
from tests import redaction_family as family
from tests.conftest import fresh_pg_database, in_process_pg_engine, unconsumed_app

AUTH = ("ops", "pw")


@pytest.fixture(scope="module")
def runs() -> Iterator[SimpleNamespace]:
    """A failed and a completed run of the family, on a database of their own."""
    store = fresh_pg_database("views")
    with in_process_pg_engine("views", *family.define(), store_url=store) as engine:
        failed = engine.start(family.PARENT, family.family_input(4101, fail=True)).wait(60)
        done = engine.start(family.PARENT, family.family_input(4102)).wait(60)
        assert failed.state is ExecutionState.FAILED, failed.failure_reason
        assert done.state is ExecutionState.COMPLETED, done.failure_reason
        yield SimpleNamespace(engine=engine, store=store, failed=failed, done=done)


def _show(engine: SagaEngine, *args: str) -> str:
    obj = SimpleNamespace(app=engine.app)
    result = CliRunner().invoke(saga_cli, ["show", *args], obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _stranger(store: str) -> SagaEngine:
    """Another service's engine on the same store: it registers none of the family."""
    return SagaEngine(unconsumed_app("stranger"), store_url=store)


def _page(engine: SagaEngine, url: str) -> str:
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    reply = client.get(url, auth=AUTH)
    assert reply.status_code == 200, url
    return reply.get_data(as_text=True)


def test_a_childs_values_are_redacted_by_its_own_markings_where_its_parent_shows_them(
    runs: SimpleNamespace,
) -> None:
    for run, order in ((runs.failed, 4101), (runs.done, 4102)):
        shown = json.loads(_show(runs.engine, run.id, "--json"))
        vault = next(s for s in shown["steps"] if s["name"] == "vault")
        assert vault["result"] == {"open": {"pin": REDACTED, "note": "opened"}, "seal": REDACTED}
        assert vault["child"]["steps"][0]["result"] == {"pin": REDACTED, "note": "opened"}
        texts = [
            json.dumps(shown),
            _show(runs.engine, run.id),
            _page(runs.engine, f"/runs/{run.id}"),
        ]
        for secret in family.secrets_of(order):
            assert not [t for t in texts if secret in t], secret
    # The parent's own failure text is scrubbed of the child's values (its scrub set).
    assert runs.failed.failure_reason == (
        f"ValueError: report refused card {REDACTED} with pin {REDACTED} and token {REDACTED}"
    )
    revealed = json.loads(_show(runs.engine, runs.done.id, "--json", "--reveal"))
    vault = next(s for s in revealed["steps"] if s["name"] == "vault")
    assert vault["result"]["seal"] == {"token": family.token_of(4102)}


def test_a_run_of_a_saga_not_registered_here_shows_no_payload_unless_revealed(
    runs: SimpleNamespace,
) -> None:
    stranger = _stranger(runs.store)
    shown = json.loads(_show(stranger, runs.done.id, "--json"))
    assert shown["input"] == NOT_REGISTERED
    assert {s["name"]: s["result"] for s in shown["steps"]} == {
        "charge": NOT_REGISTERED,
        "vault": NOT_REGISTERED,
        "report": NOT_REGISTERED,
    }
    vault = next(s for s in shown["steps"] if s["name"] == "vault")
    assert vault["child"]["input"] == NOT_REGISTERED
    texts = [
        json.dumps(shown),
        _show(stranger, runs.done.id),
        _page(stranger, f"/runs/{runs.done.id}"),
    ]
    for secret in family.secrets_of(4102):
        assert not [t for t in texts if secret in t], secret
    assert html.escape(NOT_REGISTERED) in texts[2]
    # The text search finds no run by a value it cannot tell is unmarked.
    listed = _page(stranger, f"/?text={family.card_of(4102)}")
    assert runs.done.id not in listed
    assert runs.done.id in _page(runs.engine, f"/?text={runs.done.id}")

    revealed = json.loads(_show(stranger, runs.done.id, "--json", "--reveal"))
    assert revealed["input"] == family.family_input(4102)


def test_a_child_whose_saga_is_not_registered_here_is_shown_as_such_in_its_parent(
    runs: SimpleNamespace,
) -> None:
    parent_only = _stranger(runs.store)
    parent_only.register(*[s for s in family.define() if s.name == family.PARENT])
    shown = json.loads(_show(parent_only, runs.done.id, "--json"))
    assert shown["input"] == {"order": 4102, "card": REDACTED, "fail": False}
    vault = next(s for s in shown["steps"] if s["name"] == "vault")
    assert vault["result"] == NOT_REGISTERED
    assert vault["child"]["input"] == NOT_REGISTERED
    for secret in family.secrets_of(4102):
        assert secret not in json.dumps(shown), secret
