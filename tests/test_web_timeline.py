"""The run page's timeline picture in headless Chromium, on a run that went through what it
must show: three retried attempts, an attempt lost when its worker was killed with SIGKILL,
a two-second wait and an unwind of four reversals (PostgreSQL, RabbitMQ, real prefork
workers and a real ``celery beat``). The bars are read off the SVG's elements; the page is
saved as a screenshot to look at. And a sub-saga's bar opens its child run's page."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from celery_saga import ExecutionState, RollbackStatus
from celery_saga.store import history
from celery_saga.web import Credentials, WebSettings, create_app
from tests import web_browser
from tests.conftest import Harness
from tests.test_crash_recovery import CrashRig, crash_rig, step_running, wait_for

USER, PASSWORD = "operator", "s3cret-pass"
SVG = "{http://www.w3.org/2000/svg}"
SETTINGS = WebSettings(Credentials(USER, PASSWORD), secret="test-secret")
#: How the plan drives the run: charge fails three times, pack's first attempt sleeps
#: until its worker is killed, ship fails after the gate, so the four steps before it unwind.
PLAN = {
    "charge": {"fail_attempts": 3, "sleep": 0.3},
    "pack": {"first_sleep": 6},
    "ship": {"fail": True},
}


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = web_browser.missing()
    if missing is not None:
        if os.environ.get("SAGA_REQUIRE_SERVICES") == "1":
            pytest.fail(missing + " and SAGA_REQUIRE_SERVICES=1")
        pytest.skip(missing)
    driver = web_browser.chromium(1400, 900)
    web_browser.send_basic_auth(driver, USER, PASSWORD)
    yield driver
    driver.quit()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[CrashRig]:
    yield from crash_rig("postgres-rabbitmq", tmp_path)


def _pictured_run(rig: CrashRig) -> Any:
    """The run, to its end: the worker running pack's first attempt is killed, a fresh one
    takes it over; the gate is signalled two seconds after the run reached it."""
    first = rig.start_worker()
    run = rig.client.engine.start("pictured", {"order": 6101, "plan": PLAN})
    rig.kill_and_restart_when(first, step_running(run, "pack"))
    wait_for(lambda: run.get().state is ExecutionState.WAITING, timeout=90)
    time.sleep(2)
    rig.client.engine.signal(run.id, "approved", {"by": "test"})
    execution = rig.drive_to_end(run.id)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.COMPLETED
    return run


def _bars(browser: Any) -> list[dict[str, Any]]:
    from selenium.webdriver.common.by import By

    bars = []
    for element in browser.find_elements(By.CSS_SELECTOR, "#timeline-chart g.bar"):
        names = ("kind", "name", "attempt", "outcome", "lane", "start", "end")
        bar: dict[str, Any] = {name: element.get_attribute(f"data-{name}") for name in names}
        rect = element.find_element(By.TAG_NAME, "rect")
        bar["size"] = rect.size
        bar["fill"] = rect.value_of_css_property("fill")
        bars.append(bar)
    return bars


def test_the_timeline_picture_draws_one_bar_per_attempt_and_per_reversal_in_time_order(
    rig: CrashRig, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    run = _pictured_run(rig)
    rows = history.load(rig.client.engine.db, run.id)
    told = history.ATTEMPT_KINDS | history.REVERSAL_KINDS
    stored = [(h.kind.split("-")[0], h.step, h.attempt) for h in rows if h.kind in told]
    with web_browser.serving(rig.client.engine, SETTINGS) as site:
        browser.get(f"{site}/runs/{run.id}")
        bars = _bars(browser)
        chart = browser.find_element(By.ID, "timeline-chart")
        browser.execute_script("arguments[0].scrollIntoView()", chart)
        browser.save_screenshot(str(tmp_path / "timeline.png"))
        text = browser.find_element(By.ID, "timeline")
        assert text.location["y"] > chart.location["y"], "the text timeline is kept beneath"
        assert "step-lost" in text.text

    drawn = [
        (b["kind"].replace("attempt", "step"), b["name"], int(b["attempt"]))
        for b in bars
        if b["kind"] != "wait"
    ]
    assert sorted(drawn) == sorted(stored), "one bar per attempt and per reversal"
    assert [b["start"] for b in bars] == sorted(b["start"] for b in bars), "in time order"
    attempts: dict[str, list[str]] = {}
    for bar in bars:
        if bar["kind"] == "attempt":
            attempts.setdefault(bar["name"], []).append(bar["outcome"])
    assert attempts == {
        "reserve": ["completed"],
        "charge": ["retrying", "retrying", "retrying", "completed"],
        "pack": ["lost", "completed"],
        "label": ["completed"],
        "ship": ["failed"],
    }
    reversals = [b for b in bars if b["kind"] == "reversal"]
    assert [(b["name"], b["outcome"]) for b in reversals] == [
        (name, "completed") for name in ("label", "pack", "charge", "reserve")
    ]
    lanes = {b["name"]: int(b["lane"]) for b in bars if b["kind"] == "attempt"}
    assert all(int(b["lane"]) == lanes[b["name"]] + 1 for b in reversals), "below its step"
    (wait,) = [b for b in bars if b["kind"] == "wait"]
    assert (wait["name"], wait["outcome"]) == ("approved", "signalled")
    waited = datetime.fromisoformat(wait["end"]) - datetime.fromisoformat(wait["start"])
    assert waited.total_seconds() >= 2
    assert all(b["size"]["width"] > 0 and b["size"]["height"] > 0 for b in bars)
    # The SVG's own style applies under the page's Content-Security-Policy.
    (lost,) = [b for b in bars if b["outcome"] == "lost"]
    assert lost["fill"] == "rgb(107, 114, 128)", lost
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


@pytest.mark.parametrize("harness", ["sqlite"], indirect=True)
def test_a_sub_sagas_bar_opens_its_child_runs_page_which_has_its_own_picture(
    harness: Harness,
) -> None:
    run = harness.start("parent", {"order": 6201})
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
    (child,) = [s.child_execution_id for s in run.get().steps if s.child_execution_id]
    client = create_app(harness.engine, SETTINGS).test_client()
    page = client.get(f"/runs/{run.id}", auth=(USER, PASSWORD)).get_data(as_text=True)
    chart = ElementTree.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    links = {
        a.get("href"): [g.get("data-name") for g in a.iter(f"{SVG}g")]
        for a in chart.iter(f"{SVG}a")
    }
    assert links == {f"/runs/{child}": ["child"]}
    child_page = client.get(f"/runs/{child}", auth=(USER, PASSWORD)).get_data(as_text=True)
    assert 'data-name="c1"' in child_page and 'data-name="c2"' in child_page
