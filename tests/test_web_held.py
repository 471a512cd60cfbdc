"""Issue 42 in the web view: a held run's page says what holds it and offers retry, skip
and unwind (each with its own CSRF token), recorded as ``web:<user>``; a refusal says why
and records nothing. Through Flask's test client, over the in-process backend and a real
prefork one."""

from __future__ import annotations

import base64
import re
import uuid
from typing import Any

from celery_saga import ExecutionState
from celery_saga.web import Credentials, WebSettings, create_app
from tests.conftest import Harness
from tests.test_hold import _history, _rows, _wait_state

USER, PASSWORD = "operator", "s3cret-pass"
SETTINGS = WebSettings(Credentials(USER, PASSWORD, None), actions=True, secret="held-secret")
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


def _client(harness: Harness) -> Any:
    return create_app(harness.engine, SETTINGS).test_client()


def _held(harness: Harness) -> tuple[str, str]:
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    run = harness.start("held_order", {"order": 77, "down": switch})
    _wait_state(harness, run.id, ExecutionState.HELD)
    return run.id, switch


def _post(client: Any, run_id: str, action: str, **form: str) -> tuple[int, str]:
    page = client.get(f"/runs/{run_id}", headers=AUTH).get_data(as_text=True)
    found = re.search(
        rf'action="/runs/{re.escape(run_id)}/{action}".*?name="csrf_token" value="([^"]+)"',
        page,
        re.S,
    )
    assert found is not None, f"no {action} form on the page"
    reply = client.post(
        f"/runs/{run_id}/{action}",
        data={"csrf_token": found[1], **form},
        headers=AUTH,
        follow_redirects=True,
    )
    return reply.status_code, reply.get_data(as_text=True)


def test_a_held_runs_page_names_the_hold_and_retry_moves_it(harness: Harness) -> None:
    client = _client(harness)
    run_id, switch = _held(harness)
    page = client.get(f"/runs/{run_id}", headers=AUTH).get_data(as_text=True)
    assert 'id="held"' in page and "step charge failed after 2 attempt(s)" in page
    assert 'id="retry"' in page and 'id="skip"' in page and 'id="unwind"' in page
    harness.test_app.set_switch(switch, False)
    status, body = _post(client, run_id, "retry", reason="provider back")
    assert status == 200 and "Retry stored" in body
    done = _wait_state(harness, run_id, ExecutionState.COMPLETED)
    assert len(_rows(harness, done.id, "effect")) == 1
    rows = [(r.actor, r.detail) for r in _history(harness, run_id) if r.kind == "hold-retried"]
    assert rows == [(f"web:{USER}", "provider back")]


def test_skip_and_unwind_from_the_page_and_a_refusal_records_nothing(harness: Harness) -> None:
    client = _client(harness)
    skipped, _ = _held(harness)
    status, body = _post(client, skipped, "skip", result='{"charged": 77}')
    assert status == 200 and "Skip stored" in body
    assert _wait_state(harness, skipped, ExecutionState.COMPLETED).step("charge").result == {
        "charged": 77
    }
    unwound, _ = _held(harness)
    token_page = client.get(f"/runs/{unwound}", headers=AUTH).get_data(as_text=True)
    status, body = _post(client, unwound, "unwind", reason="gave up")
    assert status == 200 and "Unwind stored" in body
    assert _wait_state(harness, unwound, ExecutionState.FAILED).rollback_status is not None
    token = re.search(r'/unwind".*?value="([^"]+)"', token_page, re.S)
    assert token is not None
    again = client.post(f"/runs/{unwound}/unwind", data={"csrf_token": token[1]}, headers=AUTH)
    assert again.status_code == 409
    assert "to be held; it is failed" in again.get_data(as_text=True)
    assert [r.kind for r in _history(harness, unwound)].count("hold-unwound") == 1
