"""`python manage.py saga ...` runs the same commands with the Django project's Celery app
(a real minimal project in tests/djangoproject, its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from celery_saga import ExecutionState
from tests.conftest import ROOT, Harness

PROJECT = ROOT / "tests" / "djangoproject"


def _manage(harness: Harness, *args: str, without: str = "") -> subprocess.CompletedProcess[str]:
    conf = harness.test_app.app.conf
    environment = {
        **os.environ,
        "SAGA_TEST_BROKER": conf.broker_url,
        "SAGA_TEST_STORE": conf.saga_store_url,
        "SAGA_TEST_QUEUE": conf.task_default_queue,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(PROJECT)]),
    }
    environment.pop(without, None)
    return subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), "saga", *args],
        cwd=PROJECT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _parked(harness: Harness, order: int) -> tuple[Any, str]:
    """A run of ``five`` parked at the reversal of s2 (while its switch is on)."""
    if harness.in_process:
        pytest.skip("a separate process cannot reach the in-memory broker")
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    run = harness.start(
        "five", {"order": order, "plan": {"s4": {"fail": True}, "s2": {"undo_switch": switch}}}
    )
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    return run, switch


def test_manage_py_saga_finds_shows_and_resumes_a_parked_run(harness: Harness) -> None:
    run, switch = _parked(harness, 21)
    listed = _manage(harness, "list", "--state", "compensation_stuck", "--json", "--limit", "1000")
    assert listed.returncode == 0, listed.stderr
    assert run.id in {item["id"] for item in json.loads(listed.stdout)["items"]}
    shown = _manage(harness, "show", run.id)
    assert "state=compensation_stuck" in shown.stdout and "cannot undo s2" in shown.stdout
    harness.test_app.set_switch(switch, False)
    resumed = _manage(harness, "resume", run.id)
    assert resumed.returncode == 0, resumed.stderr
    settled = run.wait(30)
    assert (settled.state, settled.rollback_status.value) == (ExecutionState.FAILED, "completed")
    refused = _manage(harness, "abandon", run.id, "--yes")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("Error: abandon needs execution")


def test_manage_py_saga_plans_then_resolves_a_parked_reversal(harness: Harness) -> None:
    run, _ = _parked(harness, 22)
    planned = _manage(harness, "plan", run.id, "--move", "resolve", "--json")
    assert planned.returncode == 0, planned.stderr
    assert [r["step"] for r in json.loads(planned.stdout)["reversals"]] == ["s1"]
    resolved = _manage(harness, "resolve", run.id, "--step", "s2", "--note", "undone by hand")
    assert resolved.returncode == 0, resolved.stderr
    settled = run.wait(30)
    assert (settled.state, settled.rollback_status.value) == (ExecutionState.FAILED, "completed")
    assert settled.step("s2").compensation_status.value == "compensation_resolved"


@pytest.mark.parametrize("harness", ["postgres-rabbitmq"], indirect=True)
def test_manage_py_saga_cancels_the_runs_of_a_label_as_one_operation(harness: Harness) -> None:
    batch = uuid.uuid4().hex[:10]
    runs = [
        harness.engine.start("gate_last", {"order": n}, labels={"batch": batch}).id
        for n in range(3)
    ]
    for run in runs:
        assert harness.engine.handle(run).wait(30).state is ExecutionState.WAITING
    where = ["--where", f"label.batch={batch}"]
    shown = _manage(harness, "cancel", *where, "--dry-run")
    assert shown.returncode == 0 and "3 run(s) match" in shown.stdout, shown.stderr
    done = _manage(harness, "cancel", *where, "--yes")
    assert done.returncode == 0, done.stderr
    assert "3 acted on, 0 refused" in done.stdout
    for run in runs:
        cancelled = harness.engine.handle(run).wait(30, states=[ExecutionState.CANCELLED])
        assert cancelled.state is ExecutionState.CANCELLED


def test_manage_py_saga_names_a_missing_celery_app(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("runs once, with the server backends")
    done = _manage(harness, "stats", without="SAGA_TEST_BROKER")
    # The sagaapp module builds its app only with a broker set: without it, nothing to find.
    assert done.returncode == 1
    assert "SAGA_CELERY_APP = 'tests.sagaapp:app' cannot be imported" in done.stderr


#: The app call_command() operates on: SAGA_CELERY_APP names this attribute.
APP: Any = None


def test_call_command_runs_the_same_commands_and_refusals_raise_command_error(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    global APP
    import django
    from django.conf import settings
    from django.core.management import CommandError, call_command

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["celery_saga.contrib.django"],
            SAGA_CELERY_APP="tests.test_django_commands:APP",
        )
        django.setup()
    APP = harness.test_app.app
    run = harness.start("five", {"order": 22})
    assert run.wait(30).state is ExecutionState.COMPLETED
    capsys.readouterr()
    call_command("saga", "list", "--saga", "five", "--limit", "1000", "--json")
    listed = json.loads(capsys.readouterr().out)
    assert run.id in {item["id"] for item in listed["items"]}
    with pytest.raises(CommandError, match="to be compensation_stuck; it is completed"):
        call_command("saga", "resume", run.id)
    with pytest.raises(CommandError, match="no saga execution with id 'nope'"):
        call_command("saga", "show", "nope")


def test_manage_py_saga_pauses_lists_and_unpauses_a_step(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("a separate process cannot reach the in-memory broker")
    paused = _manage(harness, "pause", "paused_order", "--step", "charge", "--reason", "down")
    assert paused.returncode == 0, paused.stderr
    try:
        run = harness.start("paused_order", {"order": 22})
        ends = time.monotonic() + 30
        while harness.engine.get(run.id).state is not ExecutionState.HELD:
            assert time.monotonic() < ends, harness.worker_logs()
            time.sleep(0.05)
        listed = _manage(harness, "pauses")
        assert "paused_order.charge" in listed.stdout and "(1 held)" in listed.stdout
        refused = _manage(harness, "pause", "paused_order", "--step", "charge", "--reason", "x")
        assert refused.returncode == 1 and "paused already" in refused.stderr
    finally:
        unpaused = _manage(harness, "unpause", "paused_order", "--step", "charge", "--rate", "5/s")
    assert unpaused.returncode == 0, unpaused.stderr
    assert "unpaused paused_order.charge" in unpaused.stdout
    assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()
