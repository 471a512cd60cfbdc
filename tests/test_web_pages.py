"""The web view's pages through Flask's test client on a SQLite store (no worker needed):
what it shows of a payload it cannot open, and what a read-only view refuses."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import Saga, SagaEngine, get_clock, set_clock
from celery_saga.encryption import new_key
from celery_saga.store import history, pauses
from celery_saga.store.codec import use_codec
from celery_saga.testing import ControlledClock
from celery_saga.web import Credentials, WebSettings, create_app, csrf
from tests.conftest import unconsumed_app

AUTH = ("ops", "pw")


def _reserve(ctx: Any) -> None:
    return None


def _engine(store: str, **conf: Any) -> SagaEngine:
    app = unconsumed_app("web-pages")
    app.conf.update(saga_store_url=store, **conf)
    engine = SagaEngine(app)
    engine.register(Saga("vaulted").step("reserve", _reserve).wait_for("go"))
    engine.ensure_schema()
    return engine


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/web.sqlite3"
    use_codec(None)  # the codec is the process's: leave none behind


def test_a_payload_whose_key_this_process_lacks_shows_as_the_key_it_names(store: str) -> None:
    sealing = _engine(store, saga_payload_keys={"k1": new_key()})
    run = sealing.start("vaulted", {"card": "4111-0000"})
    keyless = _engine(store, saga_payload_keys={"k2": new_key()})
    client = create_app(keyless, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{run.id}", auth=AUTH)
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert "&lt;sealed with key &#39;k1&#39;&gt;" in text and "4111-0000" not in text
    listed = client.get("/?text=k1", auth=AUTH)
    assert run.id in listed.get_data(as_text=True)


def test_a_read_only_view_shows_no_buttons_and_refuses_every_post(store: str) -> None:
    engine = _engine(store)
    run = engine.start("vaulted", {"card": "x"})
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True)
    assert 'id="signal"' not in page and "csrf_token" not in page
    refused = client.post(f"/runs/{run.id}/cancel", auth=AUTH, data={"csrf_token": "x"})
    assert refused.status_code == 403
    assert engine.get(run.id).state.value == "running"


def _form_token(page: str, action: str) -> str:
    """The CSRF token that the page's form for ``action`` carries."""
    form = rf'action="[^"]*/{action}">\s*<input type="hidden" name="csrf_token" value="([^"]+)"'
    found = re.search(form, page)
    assert found is not None, f"no {action} form on the page"
    return found.group(1)


def test_a_form_token_is_good_for_its_own_action_on_its_own_run_only(store: str) -> None:
    """A token read from the page of one run's cancel (a proxy's log, a shared screenshot)
    neither cancels another run nor signals this one."""
    engine = _engine(store)
    first, second = (engine.start("vaulted", {"card": "x"}) for _ in range(2))
    settings = WebSettings(Credentials(*AUTH), actions=True, secret="s")
    client = create_app(engine, settings).test_client()
    token = _form_token(client.get(f"/runs/{first.id}", auth=AUTH).get_data(as_text=True), "cancel")
    for url in (f"/runs/{second.id}/cancel", f"/runs/{first.id}/signal"):
        refused = client.post(url, auth=AUTH, data={"csrf_token": token, "event": "go"})
        assert refused.status_code == 403, url
        assert "for another form" in refused.get_data(as_text=True)
    assert [engine.get(r.id).state.value for r in (first, second)] == ["running", "running"]
    assert "signalled" not in [row.kind for row in history.load(engine.db, first.id)]
    done = client.post(f"/runs/{first.id}/cancel", auth=AUTH, data={"csrf_token": token})
    assert done.status_code == 303
    assert engine.get(first.id).state.value in ("cancelling", "cancelled")


def test_a_form_token_expires_after_minutes_not_hours(store: str) -> None:
    clock = ControlledClock()
    previous = set_clock(clock)
    try:
        engine = _engine(store)
        run = engine.start("vaulted", {"card": "x"})
        settings = WebSettings(Credentials(*AUTH), actions=True, secret="s")
        client = create_app(engine, settings).test_client()

        def cancel_token() -> str:
            return _form_token(
                client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True), "cancel"
            )

        stale = cancel_token()
        clock.advance(csrf.MAX_AGE + 1)
        refused = client.post(f"/runs/{run.id}/cancel", auth=AUTH, data={"csrf_token": stale})
        assert refused.status_code == 403 and "expired" in refused.get_data(as_text=True)
        assert csrf.MAX_AGE <= 15 * 60
        assert engine.get(run.id).state.value == "running"
        fresh = cancel_token()
        done = client.post(f"/runs/{run.id}/cancel", auth=AUTH, data={"csrf_token": fresh})
        assert done.status_code == 303
    finally:
        set_clock(previous)


def test_actions_without_credentials_are_refused_before_serving(store: str) -> None:
    with pytest.raises(ValueError, match="needs authentication"):
        create_app(_engine(store), WebSettings(actions=True))
    open_view = create_app(_engine(store), WebSettings()).test_client()
    assert open_view.get("/").status_code == 200, "read-only without credentials: open"


def test_archived_runs_are_listed_on_request_and_read_only(store: str) -> None:
    from celery_saga.worker.embedded import embedded_worker

    engine = _engine(store)
    engine.register(Saga("quick").step("reserve", _reserve))
    app = engine.app
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    with embedded_worker(app, concurrency=1):
        run = engine.start("quick", {})
        assert run.wait(30).state.value == "completed"
    assert engine.archive(0) == 1
    settings = WebSettings(Credentials(*AUTH), actions=True, secret="s")
    client = create_app(engine, settings).test_client()
    assert run.id not in client.get("/", auth=AUTH).get_data(as_text=True)
    assert run.id in client.get("/?archived=1", auth=AUTH).get_data(as_text=True)
    page = client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True)
    assert "(read-only)" in page and 'id="cancel"' not in page
    token = csrf.Forms("s", AUTH[0]).token("cancel", run.id, get_clock().now())
    refused = client.post(f"/runs/{run.id}/cancel", auth=AUTH, data={"csrf_token": token})
    assert refused.status_code == 409
    assert "archived runs are read-only" in refused.get_data(as_text=True)


def test_filters_by_version_and_age_and_a_bad_filter_is_named_not_a_crash(store: str) -> None:
    engine = _engine(store)
    run = engine.start("vaulted", {"card": "x"})
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    version = engine.definition("vaulted").hash

    def listed(query: str) -> tuple[int, str]:
        response = client.get(f"/?{query}", auth=AUTH)
        return response.status_code, response.get_data(as_text=True)

    assert run.id in listed(f"version={version}")[1]
    assert run.id in listed("newer_than=1h")[1]
    assert run.id not in listed("older_than=1h")[1]
    for query, said in [
        ("version=nope", "no version &#39;nope&#39; is known"),
        ("older_than=soon", "is not a duration"),
        ("cursor=garbage", "is not a cursor"),
    ]:
        status, page = listed(query)
        assert status == 400 and said in page, query


def test_credentials_are_read_whole_and_a_malformed_header_proves_no_one() -> None:
    from celery_saga.web.auth import authenticated_user
    from celery_saga.web.settings import parse_basic_auth

    assert parse_basic_auth("ops:pa:ss") == ("ops", "pa:ss")
    for bad in ("ops", ":pw", "ops:"):
        with pytest.raises(ValueError, match="user:password"):
            parse_basic_auth(bad)
    both = Credentials("ops", "pw", "tok")
    for header in (None, "", "Basic !!!", "Basic b3Bz", "Bearer", "Digest x", "Bearer tok2"):
        assert authenticated_user(header, both) is None, header
    assert authenticated_user("bearer tok", both) == "token"
    assert authenticated_user("Basic b3BzOnB3", both) == "ops"  # ops:pw
    assert authenticated_user("Basic b3BzOnB3", Credentials(token="tok")) is None


def _listed_ids(page: str, table: str = "runs") -> list[str]:
    """The run ids of one table of the runs page, in the order shown."""
    body = page.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<td class="id"><a href="/runs/([^"]+)">', body)


def _next_page(page: str) -> str | None:
    found = re.search(r'<a id="next" href="([^"]+)">', page)
    return html.unescape(found.group(1)) if found else None


def test_runs_are_listed_newest_first_and_oldest_first_on_request_a_page_at_a_time(
    store: str,
) -> None:
    engine = _engine(store)
    started = [engine.start("vaulted", {"n": n}).id for n in range(5)]
    settings = WebSettings(Credentials(*AUTH), page_size=2)
    client = create_app(engine, settings).test_client()

    def every_page(url: str) -> list[list[str]]:
        pages = []
        next_url: str | None = url
        while next_url is not None:
            page = client.get(next_url, auth=AUTH).get_data(as_text=True)
            pages.append(_listed_ids(page))
            next_url = _next_page(page)
        return pages

    newest = started[::-1]
    assert every_page("/") == [newest[0:2], newest[2:4], newest[4:]]
    assert every_page("/?sort=newest") == every_page("/")
    assert every_page("/?sort=oldest") == [started[0:2], started[2:4], started[4:]]
    form = client.get("/", auth=AUTH).get_data(as_text=True)
    assert re.search(r'<option value="newest" selected>newest first</option>', form), form
    status, said = _status_and_text(client, "/?sort=sideways")
    assert status == 400 and "&#39;sideways&#39; is not a sort" in said


def _status_and_text(client: Any, url: str) -> tuple[int, str]:
    response = client.get(url, auth=AUTH)
    return response.status_code, response.get_data(as_text=True)


def _undo_fails_four_times(ctx: Any) -> None:
    _UNDONE[ctx.execution_id] = _UNDONE.get(ctx.execution_id, 0) + 1
    if _UNDONE[ctx.execution_id] < 5:
        raise RuntimeError(f"undo refused, attempt {_UNDONE[ctx.execution_id]}")


def _refuse(ctx: Any) -> None:
    raise ValueError("refused")


_UNDONE: dict[str, int] = {}


def _worked(engine: SagaEngine) -> Any:
    """An in-process worker for ``engine``'s app (its queue is its own)."""
    from celery_saga.worker.embedded import embedded_worker

    engine.app.conf.broker_transport_options = {"polling_interval": 0.01}
    return embedded_worker(engine.app, concurrency=1)


def test_a_waiting_run_says_what_it_waits_for_as_saga_show_and_saga_list_say_it(
    store: str,
) -> None:
    from celery_saga import ExecutionState, get_clock
    from celery_saga.runtime.children import child_execution_id
    from celery_saga.store import queries, versions

    engine = _engine(store)
    engine.register(Saga("gated").step("reserve", _reserve).wait_for("go", timeout=3600))
    engine.register(Saga("holder").sub_saga("gated"))
    with _worked(engine):
        gated = engine.start("gated", {})
        assert gated.wait(30, states={ExecutionState.WAITING}).state is ExecutionState.WAITING
        parent = engine.start("holder", {})
        child_id = child_execution_id(parent.id, "gated")
        deadline = time.monotonic() + 30
        while (child := queries.load_execution(engine.db, child_id)) is None or (
            child.state is not ExecutionState.WAITING
        ):
            assert time.monotonic() < deadline, "the child never reached its gate"
            time.sleep(0.05)
    handed_back = engine.start("vaulted", {})  # no worker now: it stays running
    version = engine.definition("vaulted").hash
    versions.mark_waiting(
        engine.db,
        execution_id=handed_back.id,
        definition_hash=version,
        handed_back_by="old-worker",
        now=get_clock().now(),
    )
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    listed = html.unescape(client.get("/", auth=AUTH).get_data(as_text=True))
    wake_at = engine.get(gated.id).record.wake_at
    assert wake_at is not None
    reasons = {
        gated.id: f"waiting for signal 'go' until {wake_at:%Y-%m-%d %H:%M:%S}",
        parent.id: f"waiting for child run {child.id}",
        handed_back.id: f"waiting for version {version}",
    }
    rows = {r: listed.split(f">{r}</a>", 1)[1].split("</tr>", 1)[0] for r in reasons}
    for run_id, reason in reasons.items():
        assert reason in rows[run_id], (reason, rows[run_id])
    page = html.unescape(client.get(f"/runs/{gated.id}", auth=AUTH).get_data(as_text=True))
    assert f"waiting for signal 'go' until {wake_at.isoformat()}" in page


def test_a_reversal_resumed_after_four_failed_attempts_shows_all_five(store: str) -> None:
    from celery_saga import ExecutionState

    engine = _engine(store)
    engine.register(
        Saga("stubborn")
        .step("hold", _reserve, compensate=_undo_fails_four_times, compensation_retry=4)
        .step("charge", _refuse)
    )
    with _worked(engine):
        run = engine.start("stubborn", {})
        assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK
        engine.resume_compensation(run.id)
        assert run.wait(30).state is ExecutionState.FAILED
    assert _UNDONE[run.id] == 5
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    page = html.unescape(client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True))
    steps = page.split('<table id="steps">', 1)[1].split("</table>", 1)[0]
    assert "compensated</span> \N{MULTIPLICATION SIGN}5" in steps, steps
    assert "5 reversal attempts" in page.split('id="graph"', 1)[1]


def test_a_failed_step_that_was_compensated_is_drawn_apart_from_a_completed_one(
    store: str,
) -> None:
    from celery_saga import ExecutionState

    engine = _engine(store)
    engine.register(
        Saga("undone")
        .step("hold", _reserve, compensate=_reserve)
        .step("charge", _refuse, compensate=_reserve)
    )
    with _worked(engine):
        run = engine.start("undone", {})
        assert run.wait(30).state is ExecutionState.FAILED
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    page = html.unescape(client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True))
    graph = page.split('id="graph"', 1)[1]
    found = re.findall(r'<div class="box ([^"]*)" data-node="(\w+)"', graph)
    boxes = {node: classes for classes, node in found}
    assert "st-compensated" in boxes["hold"] and "st-compensated" in boxes["charge"]
    assert "fw-failed" in boxes["charge"] and "fw-failed" not in boxes["hold"]
    assert "failed -> compensated" in graph and "completed -> compensated" in graph


def test_the_runs_page_lists_the_paused_steps_and_a_held_run_says_it_waits_at_one(
    store: str,
) -> None:
    engine = _engine(store)
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    assert 'id="pauses"' not in client.get("/", auth=AUTH).get_data(as_text=True)
    engine.pause("vaulted", "reserve", reason="vault <offline>", actor="ann")
    run = engine.start("vaulted", {"card": "x"})  # no worker: held as a worker would hold it
    assert pauses.hold_at_door(
        engine.db, run.id, saga="vaulted", step="reserve", node=0, sub=0, now=get_clock().now()
    )
    listing = client.get("/", auth=AUTH).get_data(as_text=True)
    row = re.search(r'<table id="pauses">.*?</table>', listing, re.S)
    assert row is not None, listing
    assert "vault &lt;offline&gt;" in row.group(0) and ">ann<" in row.group(0)
    assert "<td>1</td>" in row.group(0), "one run held at its door"
    page = html.unescape(client.get(f"/runs/{run.id}", auth=AUTH).get_data(as_text=True))
    assert "held: paused (vault <offline>) at the door of step 'reserve'" in page
