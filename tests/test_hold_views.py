"""Issue 42: a held run as the operator sees and moves it from the shell: ``saga list``
and ``show`` name the hold, ``saga retry | skip | unwind`` move it, with who acted."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner, Result

from celery_saga import ExecutionState
from celery_saga.cli import saga
from tests.conftest import Harness
from tests.test_hold import _history, _rows, _wait_state


def _invoke(harness: Harness, *args: str) -> Result:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def _held(harness: Harness, saga_name: str = "held_order") -> tuple[Any, str]:
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    run = harness.start(saga_name, {"order": 9, "down": switch})
    return _wait_state(harness, run.id, ExecutionState.HELD), switch


def test_list_and_show_name_the_held_step_its_error_attempts_and_timeout(
    harness: Harness,
) -> None:
    execution, _ = _held(harness, "held_briefly")
    listed = _invoke(harness, "list", "--state", "held")
    assert listed.exit_code == 0, listed.output
    line = next(row for row in listed.output.splitlines() if execution.id in row)
    assert "held" in line and "payment provider down" in line
    shown = _invoke(harness, "show", execution.id)
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert "state=held" in text
    assert "held at step 'charge': waiting for an operator" in text
    assert "held step: charge  attempts: 1  error: ConnectionError: payment provider" in text
    assert "hold timeout: unwinds at " in text


def test_the_shell_retries_a_held_run_naming_the_operator(harness: Harness) -> None:
    execution, switch = _held(harness)
    harness.test_app.set_switch(switch, False)
    done = _invoke(harness, "retry", execution.id, "--reason", "provider back")
    assert done.exit_code == 0, done.output
    ended = _wait_state(harness, execution.id, ExecutionState.COMPLETED)
    assert len(_rows(harness, ended.id, "effect")) == 1
    [row] = [r for r in _history(harness, ended.id) if r.kind == "hold-retried"]
    assert row.actor and "@" in row.actor and row.detail == "provider back"


def test_the_shell_skips_with_a_json_result_and_unwinds_with_yes(harness: Harness) -> None:
    execution, _ = _held(harness)
    skipped = _invoke(harness, "skip", execution.id, "--result", '{"charged": 9}')
    assert skipped.exit_code == 0, skipped.output
    done = _wait_state(harness, execution.id, ExecutionState.COMPLETED)
    assert done.step("charge").result == {"charged": 9}
    other, _ = _held(harness)
    unwound = _invoke(harness, "unwind", other.id, "--yes", "--reason", "gave up")
    assert unwound.exit_code == 0, unwound.output
    assert _wait_state(harness, other.id, ExecutionState.FAILED).rollback_status is not None


def test_a_move_on_a_run_that_is_not_held_is_one_error_line_naming_its_state(
    harness: Harness,
) -> None:
    run = harness.start("held_order", {"order": 10})
    _wait_state(harness, run.id, ExecutionState.COMPLETED)
    for verb in (["retry"], ["skip", "--result", "{}"], ["unwind", "--yes"]):
        refused = _invoke(harness, verb[0], run.id, *verb[1:])
        assert refused.exit_code == 1
        assert refused.output.strip().splitlines()[-1].endswith("to be held; it is completed")


def test_bulk_retry_skip_and_unwind_move_the_held_runs_a_label_selects_once_each(
    harness: Harness,
) -> None:
    switch = f"down-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    batch = uuid.uuid4().hex[:8]
    runs = {
        move: [
            harness.engine.start(
                "held_order", {"order": i, "down": switch}, labels={"batch": batch, "to": move}
            ).id
            for i in range(3)
        ]
        for move in ("retry", "skip", "unwind")
    }
    for run_id in [r for ids in runs.values() for r in ids]:
        _wait_state(harness, run_id, ExecutionState.HELD)
    where = ("--where", f"label.batch={batch}", "--where", "label.to=skip")
    bad = _invoke(harness, "skip", *where, "--result", "{nope", "--yes")
    assert bad.exit_code != 0 and "JSON" in bad.output, bad.output
    dry = _invoke(harness, "retry", "--where", f"label.batch={batch}", "--dry-run")
    assert "9 run(s) match" in dry.output, dry.output
    harness.test_app.set_switch(switch, False)
    for move in ("retry", "unwind"):
        where = (f"label.batch={batch}", f"label.to={move}")
        done = harness.engine.bulk(move, where, actor="ops", reason="provider back")
        assert (done.acted, done.refused) == (3, 0), done
    skipped = _invoke(
        harness, "skip", "--where", f"label.batch={batch}", "--where", "label.to=skip",
        "--result", '{"charged": 0}', "--yes",
    )  # fmt: skip
    assert skipped.exit_code == 0, skipped.output
    for run_id in runs["retry"]:
        done = _wait_state(harness, run_id, ExecutionState.COMPLETED)
        assert len(_rows(harness, run_id, "effect")) == 1, "charged once"
        moved = [r for r in _history(harness, run_id) if r.kind == "hold-retried"]
        assert len(moved) == 1 and "(bulk bulk-" in (moved[0].actor or ""), moved
    for run_id in runs["skip"]:
        done = _wait_state(harness, run_id, ExecutionState.COMPLETED)
        assert done.step("charge").result == {"charged": 0}
    for run_id in runs["unwind"]:
        _wait_state(harness, run_id, ExecutionState.FAILED)
    again = harness.engine.bulk("retry", (f"label.batch={batch}",), actor="ops")
    assert (again.acted, again.refused) == (0, 0), "nothing is held any more"
