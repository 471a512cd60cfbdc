"""The web view answers only the names it is reached by: a page of another site that has
its name resolve to 127.0.0.1 (DNS rebinding) reads nothing from a view on loopback, no
other site frames it, and a view that listens beyond loopback says so when it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from celery_saga import Saga, SagaEngine
from celery_saga.web import Credentials, WebSettings, create_app
from celery_saga.web.hosts import exposure_warning
from tests.conftest import ROOT, fresh_pg_database, require_services, unconsumed_app

AUTH = ("ops", "pw")


def _hold(ctx: Any) -> None:
    return None


@pytest.fixture(scope="module")
def store() -> str:
    require_services(5432)
    return fresh_pg_database("web_trust")


@pytest.fixture(scope="module")
def engine(store: str) -> Iterator[SagaEngine]:
    app = unconsumed_app("web-trust")
    app.conf.saga_store_url = store
    engine = SagaEngine(app)
    engine.register(Saga("held").step("hold", _hold).wait_for("go"))
    engine.ensure_schema()
    yield engine
    engine.db.dispose()


@pytest.mark.parametrize("credentials", [Credentials(), Credentials(*AUTH)])
@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:5580", "localhost.evil.example", "127.0.0.1.nip.io"]
)
def test_a_request_naming_another_host_gets_400_and_no_page(
    engine: SagaEngine, credentials: Credentials, host: str
) -> None:
    run = engine.start("held", {"card": "4111"})
    client = create_app(engine, WebSettings(credentials)).test_client()
    for response in (
        client.get("/", headers={"Host": host}, auth=AUTH),
        client.get(f"/runs/{run.id}", headers={"Host": host}, auth=AUTH),
        client.post(f"/runs/{run.id}/cancel", headers={"Host": host}, auth=AUTH),
    ):
        text = response.get_data(as_text=True)
        assert response.status_code == 400, (host, response.status_code)
        assert response.mimetype == "text/plain"
        assert "does not serve" in text and run.id not in text and "4111" not in text
        assert "WWW-Authenticate" not in response.headers


@pytest.mark.parametrize(
    "host",
    [
        *("localhost", "localhost:5580", "LocalHost:80", "127.0.0.1", "127.0.0.1:5580"),
        *("[::1]", "[::1]:5580", "saga.internal", "saga.internal:8443", "10.0.0.7:5580"),
    ],
)
def test_loopback_names_and_the_trusted_hosts_are_served_with_or_without_a_port(
    engine: SagaEngine, host: str
) -> None:
    settings = WebSettings(Credentials(*AUTH), trusted_hosts=("Saga.Internal", "10.0.0.7"))
    client = create_app(engine, settings).test_client()
    assert client.get("/", headers={"Host": host}, auth=AUTH).status_code == 200


@pytest.mark.parametrize(
    "names", [("",), ("saga.internal:8443",), ("two words",), ("https://saga.internal",)]
)
def test_a_trusted_host_that_is_not_a_host_name_is_refused_before_serving(
    engine: SagaEngine, names: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match="--trusted-host takes a host name"):
        create_app(engine, WebSettings(trusted_hosts=names))


def test_an_ipv6_address_is_trusted_as_a_host_header_names_it(engine: SagaEngine) -> None:
    client = create_app(engine, WebSettings(trusted_hosts=("fd00::7",))).test_client()
    assert client.get("/", headers={"Host": "[fd00::7]:5580"}).status_code == 200


def test_every_response_says_no_site_may_frame_it(engine: SagaEngine) -> None:
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    for response in (
        client.get("/", auth=AUTH),
        client.get("/"),
        client.get("/runs/nope", auth=AUTH),
        client.get("/", headers={"Host": "evil.example"}),
    ):
        assert response.headers["X-Frame-Options"] == "DENY", response.status_code
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


@pytest.mark.parametrize(
    ("host", "authenticated", "said"),
    [
        ("0.0.0.0", False, "every page is open to whoever reaches"),
        ("::", False, "every page is open to whoever reaches"),
        ("10.0.0.7", True, "behind HTTPS"),
        ("saga.internal", True, "behind HTTPS"),
    ],
)
def test_a_view_bound_beyond_loopback_is_warned_about(
    host: str, authenticated: bool, said: str
) -> None:
    warning = exposure_warning(host, authenticated)
    assert warning is not None and said in warning and host in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_a_view_on_loopback_is_not_warned_about(host: str) -> None:
    assert exposure_warning(host, False) is None


def _status(url: str, host: str) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_saga_web_trusts_its_bound_address_and_its_trusted_hosts_and_warns_beyond_loopback(
    store: str,
) -> None:
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": "memory://localhost/",
        "SAGA_TEST_STORE": store,
        "SAGA_TEST_QUEUE": "web-trust-cli",
        "PYTHONPATH": str(ROOT),
        "SAGA_WEB_TRUSTED_HOSTS": "saga.example proxy.example",
    }
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "saga", "web"]
    served = subprocess.Popen(
        [*command, "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert served.stdout is not None
        lines = [served.stdout.readline(), served.stdout.readline()]
        warning = next(line for line in lines if "WARNING" in line)
        assert "0.0.0.0" in warning and "every page is open" in warning, lines
        started = next(line for line in lines if "saga web view on" in line)
        port = started.split("http://0.0.0.0:", 1)[1].split("/", 1)[0]
        url = f"http://127.0.0.1:{port}/"
        assert _status(url, f"127.0.0.1:{port}") == 200
        assert _status(url, f"0.0.0.0:{port}") == 200
        assert _status(url, "saga.example") == 200
        assert _status(url, "proxy.example:443") == 200
        assert _status(url, f"evil.example:{port}") == 400
    finally:
        served.terminate()
        served.wait(timeout=15)
