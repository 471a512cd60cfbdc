"""The web view (``saga web``) in headless Chromium against PostgreSQL, RabbitMQ and two
real prefork workers: runs listed and filtered, the run page of a compensated run and of
a parked one, a resume through its button, and what it refuses (401 without credentials,
403 without a CSRF token, actions without authentication)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.store import history
from celery_saga.web import Credentials, WebSettings
from tests import web_browser
from tests.conftest import ROOT, Harness

USER, PASSWORD, TOKEN = "operator", "s3cret-pass", "tok-" + uuid.uuid4().hex
SETTINGS = WebSettings(Credentials(USER, PASSWORD, TOKEN), actions=True, secret="test-secret")
#: One backend: the browser part is what these tests add, the engine is tested elsewhere.
on_postgres = pytest.mark.parametrize("harness", ["postgres-rabbitmq"], indirect=True)


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = web_browser.missing()
    if missing is not None:
        if os.environ.get("SAGA_REQUIRE_SERVICES") == "1":
            pytest.fail(missing + " and SAGA_REQUIRE_SERVICES=1")
        pytest.skip(missing)
    driver = web_browser.chromium()
    web_browser.send_basic_auth(driver, USER, PASSWORD)
    yield driver
    driver.quit()


@pytest.fixture
def site(harness: Harness) -> Iterator[str]:
    with web_browser.serving(harness.engine, SETTINGS) as url:
        yield url


def _compensated(harness: Harness, order: int) -> Any:
    run = harness.start("five", {"order": order, "plan": {"s4": {"fail": True}}})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    return run


def _parked(harness: Harness, order: int) -> tuple[Any, str]:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": order, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    return run, switch


def _ids(driver: Any, table: str) -> list[str]:
    from selenium.webdriver.common.by import By

    cells = driver.find_elements(By.CSS_SELECTOR, f"#{table} td.id")
    return [cell.text for cell in cells]


def _statuses(driver: Any) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    boxes = driver.find_elements(By.CSS_SELECTOR, "#graph .box")
    return {b.get_attribute("data-node"): b.get_attribute("data-status") for b in boxes}


@on_postgres
def test_runs_page_counts_states_lists_parked_runs_first_and_filters(
    harness: Harness, site: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    began = time.monotonic()
    done = harness.start("five", {"order": 5101})
    compensated = _compensated(harness, 5102)
    parked, _ = _parked(harness, 5103)
    assert done.wait(30).state is ExecutionState.COMPLETED
    browser.get(site + "/")
    assert parked.id in _ids(browser, "parked")
    # The harness's store holds the earlier tests' runs too: show those of this test only.
    browser.get(site + f"/?newer_than={int(time.monotonic() - began) + 2}s")
    assert {done.id, compensated.id, parked.id} <= set(_ids(browser, "runs"))
    counts = browser.find_element(By.ID, "counts").text
    assert "compensation_stuck" in counts

    Select(browser.find_element(By.NAME, "state")).select_by_visible_text("failed")
    browser.find_element(By.NAME, "newer_than").clear()
    browser.find_element(By.NAME, "newer_than").send_keys(f"{int(time.monotonic() - began) + 2}s")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    WebDriverWait(browser, 15).until(lambda b: "state=failed" in b.current_url)
    listed = _ids(browser, "runs")
    assert compensated.id in listed
    assert done.id not in listed and parked.id not in listed
    assert "state=failed" in browser.current_url

    browser.get(site + "/?text=5103&saga=five")
    assert _ids(browser, "runs") == [parked.id], "the text is found in the run's input"


@on_postgres
def test_run_page_of_a_compensated_run_draws_its_graph_timeline_and_history(
    harness: Harness, site: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    run = _compensated(harness, 5201)
    browser.get(f"{site}/runs/{run.id}")
    assert browser.find_element(By.ID, "state").text == "failed"
    assert _statuses(browser) == {
        "s1": "completed -> compensated",
        "s2": "completed -> compensated",
        "s3": "completed -> compensated",
        "s4": "failed",
        "s5": "not run",
    }
    timeline = browser.find_element(By.ID, "timeline").text
    assert "ValueError: s4 refused order 5201" in timeline
    assert "compensated s3" in " ".join(timeline.split())
    assert '"order": 5201' in browser.find_element(By.ID, "input").text
    assert "s1" in browser.find_element(By.ID, "results").text
    assert not browser.find_elements(By.ID, "resume"), "a finished run offers no resume"


@on_postgres
def test_parked_run_resumed_through_its_button_finishes_its_unwind_and_names_the_user(
    harness: Harness, site: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    run, switch = _parked(harness, 5301)
    browser.get(f"{site}/runs/{run.id}")
    assert browser.find_element(By.ID, "state").text == "compensation_stuck"
    assert _statuses(browser)["s2"] == "completed -> compensation_failed"
    assert "cannot undo s2" in browser.find_element(By.ID, "steps").text
    harness.test_app.set_switch(switch, False)
    browser.find_element(By.ID, "resume").click()
    assert "Resumed" in _shown(browser, "done").text
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    rows = [h for h in history.load(harness.engine.db, run.id) if h.kind == "resumed"]
    assert [h.actor for h in rows] == [f"web:{USER}"]
    browser.get(f"{site}/runs/{run.id}")
    assert browser.find_element(By.ID, "state").text == "failed"
    assert f"web:{USER}" in browser.find_element(By.ID, "history").text


def _shown(browser: Any, element_id: str) -> Any:
    """The element once the page a click submitted has loaded (a click does not wait)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.ID, element_id))
    return browser.find_element(By.ID, element_id)


def _status(url: str, headers: dict[str, str], data: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


@on_postgres
def test_requests_without_valid_credentials_are_refused_with_401(
    harness: Harness, site: str
) -> None:
    assert _status(site + "/", {}) == 401
    assert _status(site + "/", _basic(USER, "wrong")) == 401
    assert _status(site + "/", {"Authorization": "Bearer wrong"}) == 401
    assert _status(site + "/", _basic(USER, PASSWORD)) == 200
    assert _status(site + "/", {"Authorization": f"Bearer {TOKEN}"}) == 200


@on_postgres
def test_an_action_posted_without_its_csrf_token_is_refused_with_403_and_changes_nothing(
    harness: Harness, site: str
) -> None:
    run, switch = _parked(harness, 5401)
    harness.test_app.set_switch(switch, False)
    url = f"{site}/runs/{run.id}/resume"
    form = {**_basic(USER, PASSWORD), "Content-Type": "application/x-www-form-urlencoded"}
    assert _status(url, form, b"") == 403
    assert _status(url, form, b"csrf_token=forged") == 403
    time.sleep(1)
    assert run.get().state is ExecutionState.COMPENSATION_STUCK
    assert not [h for h in history.load(harness.engine.db, run.id) if h.kind == "resumed"]


def _saga_web(*arguments: str, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "saga", "web"]
    return subprocess.Popen(
        [*command, *arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        stderr=subprocess.STDOUT,
    )


def test_saga_web_refuses_actions_without_authentication_and_serves_with_it(
    tmp_path: Any,
) -> None:
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": "memory://localhost/",
        "SAGA_TEST_STORE": f"sqlite:///{tmp_path}/web.sqlite3",
        "SAGA_TEST_QUEUE": "web-cli",
        "PYTHONPATH": str(ROOT),
    }
    refused = _saga_web("--enable-actions", "--port", "0", env=env)
    try:
        output, _ = refused.communicate(timeout=60)
    finally:  # a view that started anyway serves until stopped
        if refused.poll() is None:
            refused.kill()
            refused.wait(timeout=15)
    assert refused.returncode == 1
    assert "--enable-actions needs authentication" in output
    served = _saga_web("--enable-actions", "--port", "0", "--basic-auth", "a:b", env=env)
    try:
        assert served.stdout is not None
        line = served.stdout.readline()
        assert "actions on, authentication on" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert _status(url, {}) == 401
        assert _status(url, _basic("a", "b")) == 200
    finally:
        served.terminate()
        served.wait(timeout=15)


@on_postgres
def test_values_the_saga_marks_sensitive_are_on_no_page_and_found_by_no_search(
    harness: Harness, site: str, browser: Any
) -> None:
    from celery_saga.redaction import REDACTED
    from tests.redaction_sagas import token_of

    card, address = "4111-1111-1111-5501", "5501 Hidden Lane"
    run = harness.start("private", {"order": 5501, "card": card, "address": address})
    assert run.wait(30).state is ExecutionState.FAILED, harness.worker_logs()
    browser.get(f"{site}/runs/{run.id}")
    page = browser.page_source
    for secret in (card, address, token_of(5501)):
        assert secret not in page
    assert REDACTED in page and "5501" in page
    browser.get(f"{site}/?saga=private&text={card}")
    assert _ids(browser, "runs") == [], "a search must not confirm a marked value"
    browser.get(f"{site}/?saga=private&text=5501")
    assert _ids(browser, "runs") == [run.id]


def _kinds(harness: Harness, run_id: str) -> dict[str, list[str | None]]:
    found: dict[str, list[str | None]] = {}
    for entry in history.load(harness.engine.db, run_id):
        found.setdefault(entry.kind, []).append(entry.actor)
    return found


@on_postgres
def test_signal_cancel_and_abandon_buttons_act_and_record_the_user_and_a_refusal_records_nothing(
    harness: Harness, site: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    signalled = harness.start("gate_only", {"order": 5601})
    assert signalled.wait(30, states={ExecutionState.WAITING}).state is ExecutionState.WAITING
    browser.get(f"{site}/runs/{signalled.id}")
    assert _statuses(browser)["go"] == "waiting"
    browser.find_element(By.NAME, "event").send_keys("no-such-event")
    browser.find_element(By.ID, "signal").click()
    assert "no-such-event" in _shown(browser, "refused").text
    assert "signalled" not in _kinds(harness, signalled.id)
    browser.find_element(By.NAME, "event").send_keys("go")
    browser.find_element(By.NAME, "payload").send_keys('{"by": "maria"}')
    browser.find_element(By.ID, "signal").click()
    assert "Signal recorded" in _shown(browser, "done").text
    assert signalled.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    assert _kinds(harness, signalled.id)["signalled"] == [f"web:{USER}"]
    browser.get(f"{site}/runs/{signalled.id}")
    assert '"by": "maria"' in browser.find_element(By.ID, "signals").text

    cancelled = harness.start("gate_only", {"order": 5602})
    assert cancelled.wait(30, states={ExecutionState.WAITING}).state is ExecutionState.WAITING
    browser.get(f"{site}/runs/{cancelled.id}")
    browser.find_element(By.NAME, "reason").send_keys("customer called")
    browser.find_element(By.ID, "cancel").click()
    assert "Cancel" in _shown(browser, "done").text
    assert cancelled.wait(60).state is ExecutionState.CANCELLED, harness.worker_logs()
    assert _kinds(harness, cancelled.id)["cancelled"] == [f"web:{USER}"]

    parked, _ = _parked(harness, 5603)
    browser.get(f"{site}/runs/{parked.id}")
    browser.find_element(By.ID, "abandon").click()
    assert "Abandoned" in _shown(browser, "done").text
    assert parked.get().state is ExecutionState.FAILED
    assert _kinds(harness, parked.id)["abandoned"] == [f"web:{USER}"]


@on_postgres
def test_a_failed_step_that_was_compensated_looks_unlike_a_completed_one_that_was(
    harness: Harness, site: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    run = harness.start("failed_eligible", {"order": 5701, "plan": {"b": {"fail": True}}})
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    browser.get(f"{site}/runs/{run.id}")
    assert _statuses(browser) == {"a": "completed -> compensated", "b": "failed -> compensated"}
    boxes = {
        b.get_attribute("data-node"): b
        for b in browser.find_elements(By.CSS_SELECTOR, "#graph .box")
    }
    drawn = {
        node: tuple(
            box.value_of_css_property(name)
            for name in ("border-left-color", "border-left-width", "background-image")
        )
        for node, box in boxes.items()
    }
    assert drawn["a"] != drawn["b"], drawn
    assert "failed -> compensated" in boxes["b"].text
    assert "completed -> compensated" in boxes["a"].text
