"""`celery saga ...`: operators find a parked run, see why, resume it; refusals change nothing.

The commands run in this process through click (every backend: the workers of the harness do
the work) and, on the server backends, as a real `celery -A ... saga` subprocess found
through the ``celery.commands`` entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from celery_saga import ExecutionState, RollbackStatus, Saga, SagaEngine
from celery_saga.cli import saga
from celery_saga.gauges import StoreGauges
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import ROOT, Harness, unconsumed_app


def _invoke(harness: Harness, *args: str, input: str | None = None) -> Result:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga, list(args), obj=obj, input=input, catch_exceptions=False)


def _parked(harness: Harness) -> tuple[str, str]:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = harness.start("five", {"order": 11, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    return run.id, switch


def _listed(harness: Harness, *filters: str) -> dict[str, Any]:
    result = _invoke(harness, "list", "--limit", "1000", "--json", *filters)
    assert result.exit_code == 0, result.output
    return {item["id"]: item for item in json.loads(result.output)["items"]}


def test_an_operator_finds_a_parked_run_sees_why_and_resumes_it(harness: Harness) -> None:
    run_id, switch = _parked(harness)
    parked = _listed(harness, "--state", "compensation_stuck", "--saga", "five")
    assert run_id in parked
    assert all(item["state"] == "compensation_stuck" for item in parked.values())
    table = _invoke(harness, "list", "--state", "compensation_stuck", "--limit", "1000").output
    assert run_id in table and "reversal of step 's2' failed" in table

    shown = _invoke(harness, "show", run_id)
    assert shown.exit_code == 0, shown.output
    assert "state=compensation_stuck  rollback=stuck" in shown.output
    assert "failure_reason: ValueError: s4 refused order 11" in shown.output
    assert "compensation_failed s2  after 3 attempts  ConnectionError: cannot undo s2" in (
        shown.output
    )
    timeline = json.loads(_invoke(harness, "show", run_id, "--json").output)
    steps = {s["name"]: s for s in timeline["steps"]}
    assert steps["s4"]["status"] == "failed" and steps["s3"]["attempts"] == 1
    assert steps["s3"]["compensation"]["status"] == "compensated"
    assert steps["s1"]["compensation"] is None
    assert steps["s1"]["idempotency_key"] == f"{run_id}:s1:0:forward"

    harness.test_app.set_switch(switch, False)
    resumed = _invoke(harness, "resume", run_id)
    assert resumed.exit_code == 0, resumed.output
    settled = harness.engine.handle(run_id).wait(30)
    assert settled.state is ExecutionState.FAILED, harness.worker_logs()
    after = _listed(harness, "--saga", "five", "--state", "failed", "--rollback", "completed")
    assert after[run_id]["rollback_status"] == RollbackStatus.COMPLETED.value


def test_refused_commands_print_one_line_exit_nonzero_and_change_nothing(
    harness: Harness,
) -> None:
    done = harness.start("five", {"order": 12})
    version = done.wait(30).record.version
    refusals = [
        (("show", "no-such-run"), "no saga execution with id 'no-such-run'"),
        (("resume", "no-such-run"), "no saga execution with id 'no-such-run'"),
        (("resume", done.id), "to be compensation_stuck; it is completed"),
        (("abandon", done.id, "--yes"), "to be compensation_stuck; it is completed"),
        (("signal", done.id, "approved"), "has no wait_for('approved')"),
        (("signal", done.id, "approved", "--payload", "{oops"), "not valid JSON"),
        (("list", "--cursor", "garbage"), "not a cursor"),
        (("list", "--older-than", "soon"), "not a duration"),
        (("cleanup", "--older-than", "-1d"), "not a duration"),
    ]
    for args, message in refusals:
        result = _invoke(harness, *args)
        assert result.exit_code != 0, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:"), (args, result.output)
        assert message in lines[0], (args, lines[0])
    assert done.get().record.version == version


def test_abandon_asks_first_and_a_no_leaves_the_run_parked(harness: Harness) -> None:
    run_id, _ = _parked(harness)
    before = harness.engine.get(run_id).record.version
    declined = _invoke(harness, "abandon", run_id, input="n\n")
    assert declined.exit_code != 0 and "Aborted" in declined.output
    assert (  # the whole question, not a sentence cut before its last word
        f"The steps of {run_id} (saga five) not yet reversed will never be reversed, and the "
        "run ends failed. Abandon its unwind? [y/N]: n"
    ) in declined.output
    assert harness.engine.get(run_id).record.version == before
    accepted = _invoke(harness, "abandon", run_id, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "1 step(s) marked compensation_skipped" in accepted.output
    assert harness.engine.get(run_id).rollback_status is RollbackStatus.STUCK


def test_stats_counts_runs_by_state_and_names_the_oldest_parked(harness: Harness) -> None:
    run_id, _ = _parked(harness)
    found = json.loads(_invoke(harness, "stats", "--json").output)
    assert found["by_saga"]["five"]["compensation_stuck"] >= 1
    assert found["parked"] == found["by_state"]["compensation_stuck"]
    assert found["oldest"]["parked"] is not None
    listed = _listed(harness, "--state", "compensation_stuck")
    assert found["parked"] == len(listed) and run_id in listed
    harness.engine.abandon_compensation(run_id)


def test_stats_names_the_event_the_oldest_waiting_run_waits_for(tmp_path: Path) -> None:
    app = unconsumed_app("stats-gate")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/stats.sqlite3")
    engine.register(Saga("gated").step("reserve", lambda: 1).wait_for("approved", timeout=3600))
    with embedded_worker(app, concurrency=1):
        run = engine.start("gated", {})
        assert run.wait(30, states={ExecutionState.WAITING}).state is ExecutionState.WAITING
    obj = SimpleNamespace(app=app)

    def invoked(*args: str) -> str:
        return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False).output

    found = json.loads(invoked("stats", "--json"))
    oldest = found["oldest"]["waiting"]
    assert (oldest["id"], oldest["waiting_for_event"]) == (run.id, "approved")
    assert oldest["waiting_for_version"] is None
    # As `saga list` says it of the same run, and as many as the gauges count.
    (listed,) = json.loads(invoked("list", "--state", "waiting", "--json"))["items"]
    assert listed["waiting_for_event"] == oldest["waiting_for_event"]
    gauges = StoreGauges(engine.db)
    gauges.refresh()
    assert found["by_saga"]["gated"]["waiting"] == gauges.reading.runs["gated", "waiting"] == 1
    printed = [line for line in invoked("stats").splitlines() if line.startswith("oldest")]
    assert len(printed) == 1 and printed[0].startswith(f"oldest waiting: {run.id} (gated)")
    assert printed[0].endswith("waiting for signal 'approved'"), printed


def _celery(harness: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SAGA_TEST_BROKER": harness.test_app.app.conf.broker_url,
        "SAGA_TEST_STORE": harness.test_app.app.conf.saga_store_url,
        "SAGA_TEST_QUEUE": harness.test_app.app.conf.task_default_queue,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "celery", "-A", "tests.sagaapp:app", "saga", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_celery_command_resumes_a_parked_run_from_a_shell(harness: Harness) -> None:
    if harness.in_process:
        pytest.skip("a separate process cannot reach the in-memory broker")
    run_id, switch = _parked(harness)
    listed = _celery(harness, "list", "--state", "compensation_stuck", "--limit", "1000")
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout
    shown = _celery(harness, "show", run_id)
    assert "rollback_reason:" in shown.stdout and "cannot undo s2" in shown.stdout
    harness.test_app.set_switch(switch, False)
    resumed = _celery(harness, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert harness.engine.handle(run_id).wait(30).state is ExecutionState.FAILED
    final = json.loads(_celery(harness, "show", run_id, "--json").stdout)
    assert (final["state"], final["rollback_status"]) == ("failed", "completed")
    again = _celery(harness, "resume", run_id)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"Error: resume_compensation needs execution {run_id!r} (saga 'five') to be "
        "compensation_stuck; it is failed"
    ]


def test_archived_runs_stay_readable_through_show_and_list(saga_engine: Any, saga_kit: Any) -> None:
    from celery_saga import Saga

    saga_engine.register(Saga("tiny").step("only", lambda ctx: {"n": 1}))
    run_id = saga_kit.run("tiny").execution.id
    obj = SimpleNamespace(app=saga_engine.app)

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)

    gate = Saga("gate").wait_for("go").step("after", lambda ctx: ctx.signals["go"])
    saga_engine.register(gate)
    waiting = saga_kit.run("gate").execution.id
    assert invoke("cleanup", "--older-than", "0s", "--archive").output.startswith("archived 1 ")
    shown = invoke("show", run_id)
    assert shown.exit_code == 0 and "archived " in shown.output
    assert "completed  only" in shown.output
    assert run_id in json.loads(invoke("list", "--archived", "--json").output)["items"][0]["id"]
    assert run_id not in invoke("list").output and waiting in invoke("list").output
    refused = invoke("resume", run_id)
    assert refused.exit_code == 1 and "archived runs are read-only" in refused.output
    bad = invoke("signal", waiting, "go", "--payload", "[1,")
    assert bad.exit_code == 1 and saga_engine.get(waiting).state is ExecutionState.WAITING
    sent = invoke("signal", waiting, "go", "--payload", '{"by": "ops"}')
    assert sent.exit_code == 0 and "the run resumed" in sent.output, sent.output
    assert saga_kit.finish(waiting).results["after"] == {"by": "ops"}


def test_show_names_groups_and_iterations_and_nests_child_runs(harness: Harness) -> None:
    parent = harness.start("parent", {"order": 13})
    fanout = harness.start("fanout", {"order": 14})
    batch = harness.start("batch", {"items": ["x", "y"]})
    for run in (parent, fanout, batch):
        assert run.wait(30).state is ExecutionState.COMPLETED, harness.worker_logs()

    shown = json.loads(_invoke(harness, "show", parent.id, "--json").output)
    (holder,) = [s for s in shown["steps"] if s["child"]]
    assert holder["within"]["kind"] == "sub_saga"
    child = holder["child"]
    assert (child["saga"], child["parent_execution_id"]) == ("child", parent.id)
    assert [s["name"] for s in child["steps"]] == ["c1", "c2"]
    text = _invoke(harness, "show", parent.id).output
    assert "  | completed  c2" in text and "  | started    saga child" in text

    members = json.loads(_invoke(harness, "show", fanout.id, "--json").output)["steps"]
    grouped = {s["name"]: s["within"] for s in members}
    assert grouped["p2"] == {"kind": "parallel", "name": "group"}
    assert grouped["first"] is None

    packed = json.loads(_invoke(harness, "show", batch.id, "--json").output)["steps"]
    iterations = [(s["step"], s["iteration"]) for s in packed if s["step"] == "pack"]
    assert iterations == [("pack", 0), ("pack", 1)]
    assert packed[1]["within"]["kind"] == "for_each"


def test_list_pages_through_every_run_without_gaps(harness: Harness) -> None:
    for order in range(5):
        harness.start("failed_eligible", {"order": order}).wait(30)
    seen: list[str] = []
    cursor: list[str] = []
    while True:
        page = json.loads(
            _invoke(
                harness, "list", "--saga", "failed_eligible", "--limit", "2", "--json", *cursor
            ).output
        )
        seen += [item["id"] for item in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = ["--cursor", page["next_cursor"]]
    everything = _listed(harness, "--saga", "failed_eligible")
    assert seen == list(everything) and len(seen) >= 5


def test_db_commands_show_and_move_the_store_schema(saga_celery_app: Any) -> None:
    from celery_saga.store import schema

    head = schema.head_revision()
    obj = SimpleNamespace(app=saga_celery_app)  # no engine yet: the app's saga_store_url

    def invoke(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(saga, ["db", *args], obj=obj, input=input)

    assert "store revision: none (empty store)" in invoke("current").output
    assert invoke("upgrade").output.strip() == f"store revision: none -> {head}"
    assert "(up to date)" in invoke("current").output
    declined = invoke("downgrade", "0001", input="n\n")
    assert declined.exit_code == 1 and f"store revision: {head};" in invoke("current").output
    moved = invoke("downgrade", "0001", "--yes")
    assert moved.output.strip() == f"store revision: {head} -> 0001"
    assert "behind: run `saga db upgrade`" in invoke("current").output
    unknown = invoke("upgrade", "9999")
    assert unknown.exit_code == 1
    assert unknown.output.strip().startswith("Error: unknown store revision '9999'")
    assert invoke("upgrade").output.strip() == f"store revision: 0001 -> {head}"


def test_list_filters_by_age(saga_engine: Any, saga_kit: Any) -> None:
    from celery_saga import Saga

    saga_engine.register(Saga("aged").step("only", lambda ctx: 1))
    old = saga_kit.run("aged").execution.id
    saga_kit.clock.advance(2 * 3600)
    new = saga_kit.run("aged").execution.id
    obj = SimpleNamespace(app=saga_engine.app)

    def ids(*args: str) -> list[str]:
        result = CliRunner().invoke(saga, ["list", "--json", *args], obj=obj)
        return [item["id"] for item in json.loads(result.output)["items"]]

    assert ids("--older-than", "1h") == [old]
    assert ids("--newer-than", "1h") == [new]
    assert ids("--older-than", "2h") == [old]  # inclusive
    assert ids("--older-than", "3h") == []


def _command_paths(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _command_paths(command, (*path, name))
        else:
            found.append((*path, name))
    return found


def test_every_command_line_mistake_prints_one_error_line_and_exits_1() -> None:
    obj = SimpleNamespace(app=unconsumed_app("cli-usage"))
    # (click words some messages differently from one release to the next)
    mistakes: list[tuple[tuple[str, ...], str]] = [
        ((*path, "--no-such-option"), "--no-such-option") for path in _command_paths(saga)
    ]
    mistakes += [
        (("--no-such-option", "list"), "--no-such-option"),
        (("no-such-command",), "No such command 'no-such-command'"),
        (("db", "no-such-command"), "No such command 'no-such-command'"),
        (("show",), "Missing argument 'EXECUTION_ID'"),
        (("db", "downgrade"), "Missing argument 'REVISION'"),
        (("list", "--state", "nope"), "Invalid value for '--state'"),
        (("list", "--limit", "0"), "Invalid value for '--limit'"),
        (("list", "-A", "proj"), "the app option goes before the command"),
        (("signal", "r", "e", "--payload", "1", "--payload-file", "f"), "not both"),
    ]
    assert len(mistakes) > 15
    for args, message in mistakes:
        result = CliRunner().invoke(saga, list(args), obj=obj)
        assert result.exit_code == 1, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.output)
        assert message in lines[0] and "--help)" in lines[0], (args, lines[0])


_CLI_APP = """
from celery import Celery
from celery_saga import SagaEngine

app = Celery("cliapp", broker="memory://localhost/")
app.conf.saga_store_url = "sqlite:///store.sqlite3"
SagaEngine(app)
"""


def test_the_celery_command_reports_a_command_line_mistake_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "cliapp.py").write_text(_CLI_APP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    for args, message in [
        (("list", "--bogus"), "--bogus"),
        (("show",), "Missing argument 'EXECUTION_ID'"),
        (("no-such-command",), "No such command 'no-such-command'"),
        (("db", "downgrade"), "Missing argument 'REVISION'"),
    ]:
        command = [sys.executable, "-m", "celery", "-A", "cliapp", "saga", *args]
        found = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert found.returncode == 1, (args, found.stderr)
        lines = found.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, found.stderr)
        assert message in lines[0] and found.stdout == "", (args, found.stdout, lines[0])
