"""No input gives the web view or the CLI a 500 or a traceback: ages past any date, NUL
characters PostgreSQL refuses, a payload nested 50,000 deep, and a run id holding ``/``
(which opens and is acted on like any other); then every query parameter and form field
fuzzed on a real store."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_saga import Saga, SagaEngine, SagaError
from celery_saga.cli import saga
from celery_saga.runtime.clock import get_clock
from celery_saga.store import inspection
from celery_saga.web import Credentials, WebSettings, create_app, csrf
from celery_saga.web.listing import ListQuery
from tests.conftest import fresh_pg_database, require_services, unconsumed_app

AUTH = ("ops", "pw")
SECRET = "bad-input"
#: What no answer may hold: a traceback, or the driver's words for what PostgreSQL refused.
LEAKS = ("Traceback", "psycopg", "DataError", "NUL (0x00)", "[SQL:", "sqlalche.me")
DEEP = "[" * 50_000 + "]" * 50_000


def _hold(ctx: Any) -> None:
    return None


@pytest.fixture(scope="module")
def engine() -> Iterator[SagaEngine]:
    require_services(5432)
    app = unconsumed_app("web-bad-input")
    app.conf.saga_store_url = fresh_pg_database("web_bad_input")
    engine = SagaEngine(app)
    engine.register(Saga("held").step("hold", _hold).wait_for("go"))
    engine.ensure_schema()
    yield engine
    engine.db.dispose()


@pytest.fixture(scope="module")
def client(engine: SagaEngine) -> FlaskClient:
    settings = WebSettings(Credentials(*AUTH), actions=True, secret=SECRET)
    return create_app(engine, settings).test_client()


def _form(path: str, **fields: str) -> dict[str, str]:
    """The fields of a post to ``path`` (``/runs/<run>/<action>``), with that form's token."""
    run, _, action = urllib.parse.unquote(path.removeprefix("/runs/")).rpartition("/")
    token = csrf.Forms(SECRET, AUTH[0]).token(action, run, get_clock().now())
    return {"csrf_token": token, **fields}


def _said(response: Any) -> str:
    text: str = response.get_data(as_text=True)
    assert response.status_code < 500, text[-2000:]
    assert not [leak for leak in LEAKS if leak in text], text[-2000:]
    return text


def _stored(engine: SagaEngine, execution_id: str) -> Any:
    return inspection.load_run(engine.db, execution_id)


def _cli(engine: SagaEngine, *args: str) -> Any:
    return CliRunner().invoke(saga, list(args), obj=SimpleNamespace(app=engine.app))


@pytest.mark.parametrize("age", ["99999999999d", "999999999d", "1" + "0" * 400, "100000w"])
@pytest.mark.parametrize("field", ["older_than", "newer_than"])
def test_an_age_past_any_date_is_named_not_a_500(client: FlaskClient, field: str, age: str) -> None:
    response = client.get("/", query_string={field: age}, auth=AUTH)
    assert response.status_code == 400
    assert "is longer than" in _said(response)


@pytest.mark.parametrize(
    "args",
    [
        ("list", "--older-than", "99999999999d"),
        ("list", "--newer-than", "999999999d"),
        ("cleanup", "--older-than", "99999999999d"),
        ("recover", "--stale-after", "99999999999d"),
    ],
)
def test_the_cli_names_an_age_past_any_date_in_one_line(
    engine: SagaEngine, args: tuple[str, ...]
) -> None:
    result = _cli(engine, *args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and "is longer than" in result.output
    assert result.output.count("\n") == 1 and not isinstance(result.exception, OverflowError)


def test_a_nul_in_a_run_id_is_not_found_and_no_driver_speaks(
    engine: SagaEngine, client: FlaskClient
) -> None:
    assert client.get("/runs/a%00b", auth=AUTH).status_code == 404
    posted = client.post("/runs/a%00b/cancel", data=_form("/runs/a%00b/cancel"), auth=AUTH)
    assert posted.status_code == 404 and "no saga execution" in _said(posted)
    shown = _cli(engine, "show", "a\x00b")
    assert shown.exit_code == 1 and "no saga execution with id" in shown.output
    assert "psycopg" not in shown.output


@pytest.mark.parametrize("field", ["saga", "state", "version", "cursor", "text", "sort"])
def test_a_nul_in_a_filter_is_a_400_without_driver_detail(client: FlaskClient, field: str) -> None:
    response = client.get("/", query_string={field: "a\x00b"}, auth=AUTH)
    assert response.status_code in (200, 400)
    _said(response)


def test_a_cursor_naming_a_run_id_with_a_nul_is_not_a_cursor(client: FlaskClient) -> None:
    forged = base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00|a\x00b").decode()
    response = client.get("/", query_string={"cursor": forged}, auth=AUTH)
    assert response.status_code == 400 and "is not a cursor" in _said(response)


def test_a_nul_in_a_reason_is_refused_by_the_engine_and_stores_nothing(
    engine: SagaEngine, client: FlaskClient
) -> None:
    run = engine.start("held", {})
    response = client.post(
        f"/runs/{run.id}/cancel", data=_form(f"/runs/{run.id}/cancel", reason="a\x00b"), auth=AUTH
    )
    assert response.status_code == 409 and "NUL character" in _said(response)
    with pytest.raises(SagaError, match="an actor contains a NUL character"):
        engine.cancel(run.id, actor="web:\x00")
    assert _stored(engine, run.id).record.cancelled_at is None


def test_a_payload_nested_50000_deep_is_refused_clearly(
    engine: SagaEngine, client: FlaskClient
) -> None:
    run = engine.start("held", {})
    for payload in (DEEP, "[" * 200 + "]" * 200):
        url = f"/runs/{run.id}/signal"
        response = client.post(url, data=_form(url, event="go", payload=payload), auth=AUTH)
        assert response.status_code == 409 and "nested deeper than" in _said(response)
        signalled = _cli(engine, "signal", run.id, "go", "--payload", payload)
        assert signalled.exit_code == 1 and "nested deeper than" in signalled.output
    assert _stored(engine, run.id).signals == ()


def test_a_run_id_holding_slashes_opens_and_is_acted_on(
    engine: SagaEngine, client: FlaskClient
) -> None:
    for chosen in ("tenant/order-7", "a//b", "x/cancel"):
        run = engine.start("held", {}, execution_id=chosen)
        page = client.get(f"/runs/{chosen}", auth=AUTH)
        assert page.status_code == 200 and chosen in _said(page)
        listed = client.get("/", auth=AUTH).get_data(as_text=True)
        assert f'href="/runs/{chosen}"' in listed
        cancelled = client.post(
            f"/runs/{chosen}/cancel", data=_form(f"/runs/{chosen}/cancel"), auth=AUTH
        )
        assert cancelled.status_code == 303, _said(cancelled)
        assert cancelled.headers["Location"].startswith(f"/runs/{chosen}?")
        assert _stored(engine, run.id).record.cancelled_at is not None


def test_a_path_with_a_doubled_slash_is_never_redirected_to_another_run(
    engine: SagaEngine, client: FlaskClient
) -> None:
    other = engine.start("held", {}, execution_id="lead")
    posted = client.post("/runs//lead/cancel", data=_form("/runs//lead/cancel"), auth=AUTH)
    assert posted.status_code == 404, posted.headers.get("Location")
    assert client.get("/runs//lead", auth=AUTH).status_code == 404
    assert _stored(engine, other.id).record.cancelled_at is None


# -- fuzzed: every query parameter and form field ----------------------------------------

#: Values a person or a script might send: any text (NUL included), ages and numbers of
#: every size, states and sorts, JSON of every shape, cursors of any bytes, deep nesting.
_ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=80)
_VALUES = st.one_of(
    _ANY_TEXT,
    st.from_regex(r"\A-?\d{1,30}(\.\d{1,6})?\s?[smhdwSMHDWx]?\Z"),
    st.sampled_from(["running", "waiting", "newest", "oldest", "1", "0", "\x00", "%00", "/"]),
    st.binary(max_size=60).map(lambda raw: base64.urlsafe_b64encode(raw).decode()),
    st.integers().map(str),
    st.integers(1, 60_000).map(lambda depth: "[" * depth + "]" * depth),
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | _ANY_TEXT,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ANY_TEXT, inner, max_size=4),
        max_leaves=12,
    ).map(json.dumps),
    # A value that holds a leak's word would be echoed back in its own refusal.
).filter(lambda value: not any(leak in value for leak in LEAKS))
_RAW = st.binary(max_size=40).map(lambda raw: urllib.parse.quote_from_bytes(raw, safe=""))
_FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
QUERY_PARAMETERS = [*ListQuery.__dataclass_fields__]
FORM_FIELDS = {"signal": ["event", "payload"], "cancel": ["reason"], "resume": [], "abandon": []}


@pytest.fixture(scope="module")
def runs(engine: SagaEngine) -> list[str]:
    """A few runs for the fuzzed requests to name: waiting, with a slash in the id, done."""
    started = [engine.start("held", {"n": n}).id for n in range(3)]
    started.append(engine.start("held", {}, execution_id="fuzz/one").id)
    return started


#: A value as it travels in a URL: any text percent-encoded as UTF-8, or any bytes.
_IN_URL = st.one_of(_VALUES.map(lambda value: urllib.parse.quote(value.encode(), safe="")), _RAW)


@pytest.mark.parametrize("name", [*QUERY_PARAMETERS, "done"])
@settings(_FUZZ, max_examples=150)  # each reads the runs page: about 10 ms on PostgreSQL
@given(value=_IN_URL)
def test_no_query_parameter_gives_a_500(
    client: FlaskClient, runs: list[str], name: str, value: str
) -> None:
    page = "/" if name != "done" else f"/runs/{runs[0]}"
    _said(client.get(page, query_string=f"{name}={value}", auth=AUTH))


@_FUZZ
@given(value=_VALUES, raw=_RAW)
def test_no_run_id_gives_a_500(client: FlaskClient, runs: list[str], value: str, raw: str) -> None:
    _said(client.get("/runs/" + urllib.parse.quote(value.encode(), safe="/"), auth=AUTH))
    _said(client.get("/runs/" + raw, auth=AUTH))
    _said(client.post(f"/runs/{raw}/cancel", data=_form(f"/runs/{raw}/cancel"), auth=AUTH))


@pytest.mark.parametrize(
    ("action", "field"),
    [(action, field) for action, fields in FORM_FIELDS.items() for field in [*fields, "csrf"]],
)
@_FUZZ
@given(value=_VALUES, which=st.integers(0, 3))
def test_no_form_field_gives_a_500(
    client: FlaskClient, runs: list[str], action: str, field: str, value: str, which: int
) -> None:
    url = f"/runs/{runs[which]}/{action}"
    form = _form(url, event="go") if action == "signal" else _form(url)
    form["csrf_token" if field == "csrf" else field] = value
    _said(client.post(url, data=form, auth=AUTH))
