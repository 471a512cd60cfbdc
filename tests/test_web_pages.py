"""The web view's pages through Flask's test client on a SQLite store (no worker needed):
what it shows of a payload it cannot open, and what a read-only view refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_saga import Saga, SagaEngine
from celery_saga.encryption import new_key
from celery_saga.store.codec import use_codec
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
    token = csrf.token_for(AUTH[0], "s")
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
