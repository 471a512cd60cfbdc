"""A move's plan is what the move then does (issue 42): the plan is computed, the move is
made on real workers, and what happened (reversals run, their order, steps past the pivot
left alone) is compared with it. The pure parts (order, redaction, the next path) are
checked on hand-made records."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_saga import ExecutionState, InvalidStateError, RollbackStatus, Saga, SagaError, step
from celery_saga.cli import saga as saga_cli
from celery_saga.decisions.plan import PLANNERS, LoadedRun, path_from
from celery_saga.definition.sensitivity import Sensitivity
from celery_saga.inspect.plan_text import plan_json, plan_lines
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    StepRecord,
    StepStatus,
)
from tests.conftest import Harness

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _noop(ctx: Any) -> None:
    return None


def _definition() -> Any:
    return (
        Saga("plan_shape", sensitive=("card",))
        .step("reserve", _noop, compensate=_noop)
        .step("charge", _noop, compensate=_noop)
        .parallel("notify", step("sms", _noop), step("mail", _noop))
        .step("ship", _noop)
        .pivot()
        .step("email", _noop)
        .seal()
    )


def _run(state: ExecutionState, *steps: StepRecord, committed: bool = False) -> LoadedRun:
    record = ExecutionRecord(
        "run-1", "plan_shape", "h", state, 3, 0, {"card": "4111", "order": 7}, None, None, None,
        NOW if committed else None, None, 1, NOW, NOW,
    )  # fmt: skip
    return LoadedRun(record, steps, _definition(), Sensitivity(keys=frozenset({"card"})))


def _step(index: int, name: str, **changes: Any) -> StepRecord:
    base = StepRecord(
        index, "run-1", name, index, 0, StepStatus.COMPLETED, 1, f"run-1:{name}:0:forward", True,
        {"card": "4111", "amount": index},
    )  # fmt: skip
    return replace(base, **changes)


def test_a_parked_runs_plans_follow_the_unwind_rule_with_inputs_redacted() -> None:
    run = _run(
        ExecutionState.COMPENSATION_STUCK,
        _step(1, "reserve"),
        _step(2, "charge", compensation_status=CompensationOutcome.FAILED),
        _step(3, "ship", status=StepStatus.FAILED, compensatable=False),
    )
    resolve = PLANNERS["resolve"](run, None)
    assert resolve.step == "charge" and [r.step for r in resolve.reversals] == ["reserve"]
    assert resolve.reversals[0].result == {"card": "[redacted]", "amount": 1}
    assert resolve.input == {"card": "[redacted]", "order": 7}
    assert resolve.ends == "failed, rollback completed"
    assert [r.step for r in PLANNERS["resume"](run, None).reversals] == ["charge", "reserve"]
    assert PLANNERS["abandon"](run, None).skipped == ("reserve",)
    refused = PLANNERS["resolve"](run, "reserve").refused
    assert refused == "the run is parked at step 'charge', not at step 'reserve'"
    assert PLANNERS["cancel"](run, None).refused == "already unwinding"


def test_a_cancel_reverses_the_steps_it_cuts_short_too_and_nothing_past_the_pivot() -> None:
    running = _run(
        ExecutionState.RUNNING, _step(1, "reserve"), _step(2, "charge", status=StepStatus.RUNNING)
    )
    plan = PLANNERS["cancel"](running, None)
    assert [(r.step, r.step_status) for r in plan.reversals] == [
        ("charge", "failed"),
        ("reserve", "completed"),
    ]
    assert plan.ends == "cancelled, rollback completed"
    past = _run(ExecutionState.RUNNING, _step(1, "reserve"), _step(2, "charge"), committed=True)
    assert PLANNERS["cancel"](past, None).refused == "past pivot"
    unwind = PLANNERS["unwind"](past, None)
    assert unwind.reversals == () and unwind.past_pivot == ("reserve", "charge")
    assert unwind.ends == "failed, rollback not_applicable"


def test_a_reversal_whose_compensation_vanished_is_where_the_plan_says_the_unwind_halts() -> None:
    # ``ship`` owed a reversal when it ran; the run's version (here) declares none for it.
    run = _run(ExecutionState.RUNNING, _step(1, "reserve"), _step(2, "ship"))
    plan = PLANNERS["unwind"](run, None)
    assert plan.reversals == () and plan.halts_at == "ship"
    assert plan.ends == "compensation_stuck at the reversal of ship"


def test_the_path_a_run_takes_next_from_a_step() -> None:
    definition = _definition()
    assert path_from(definition, "charge", including=True) == (
        "charge", "notify", "ship", "pivot", "email",
    )  # fmt: skip
    assert path_from(definition, "charge", including=False) == ("notify", "ship", "pivot", "email")
    assert path_from(definition, "sms", including=False) == ("notify", "ship", "pivot", "email")
    assert path_from(definition, "email", including=False) == ()
    assert path_from(definition, "nowhere", including=True) == ()


# -- the plan, then the move, on real workers --------------------------------------------
def _reversals(harness: Harness, execution_id: str) -> list[str]:
    return [e.step for e in harness.test_app.entries(execution_id) if e.direction == "compensate"]


def _parked(harness: Harness) -> tuple[Any, str]:
    switch = f"undo-{uuid.uuid4().hex}"
    harness.test_app.set_switch(switch, True)
    run = harness.start("four_back", {"plan": {"e": {"fail": True}, "c": {"undo_switch": switch}}})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, harness.worker_logs()
    return run, switch


def _cli(harness: Harness, *args: str) -> Any:
    obj = SimpleNamespace(app=harness.test_app.app)
    return CliRunner().invoke(saga_cli, list(args), obj=obj)


@pytest.mark.parametrize("move", ["resolve", "resume"])
def test_a_parked_runs_plan_is_what_the_move_does(harness: Harness, move: str) -> None:
    run, switch = _parked(harness)
    harness.test_app.set_switch(switch, False)
    plan = harness.engine.plan(run.id, move)
    before = _reversals(harness, run.id)
    if move == "resolve":
        harness.engine.resolve(run.id, step="c", note="undone in the console")
    else:
        harness.engine.resume_compensation(run.id)
    execution = run.wait(30)
    assert _reversals(harness, run.id)[len(before) :] == [r.step for r in plan.reversals]
    assert plan.ends == f"{execution.state.value}, rollback {execution.rollback_status.value}"


def test_dry_runs_print_the_plan_and_change_nothing(harness: Harness) -> None:
    run, _ = _parked(harness)
    version = run.get().record.version
    for args in (
        ("resolve", run.id, "--step", "c", "--note", "n", "--dry-run"),
        ("resume", run.id, "--dry-run"),
        ("abandon", run.id, "--dry-run"),
        ("cancel", run.id, "--dry-run"),
    ):
        result = _cli(harness, *args)
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"plan: {args[0]} of {run.id}"), result.output
    resolve = _cli(harness, "resolve", run.id, "--step", "c", "--note", "n", "--dry-run")
    assert "  1. b (completed)" in resolve.output and "  2. a (completed)" in resolve.output
    assert (
        "marked compensation_skipped: b, a" in _cli(harness, "abandon", run.id, "--dry-run").output
    )
    shown = json.loads(_cli(harness, "plan", run.id, "--move", "resolve", "--json").output)
    assert [r["step"] for r in shown["reversals"]] == ["b", "a"]
    assert run.get().record.version == version, "a dry run stores nothing"
    assert run.get().state is ExecutionState.COMPENSATION_STUCK


def test_a_running_runs_cancel_plan_is_what_the_cancel_does(harness: Harness) -> None:
    run = harness.start("four_back", {"plan": {"d": {"sleep": 3, "mark_begin": True}}})
    deadline = time.monotonic() + 20
    while not any(e.direction == "forward_begin" for e in harness.test_app.entries(run.id)):
        assert time.monotonic() < deadline, harness.worker_logs()
        time.sleep(0.05)
    plan = harness.engine.plan(run.id, "cancel")
    assert [r.step for r in plan.reversals] == ["d", "c", "b", "a"]
    harness.engine.cancel(run.id, "plan check")
    execution = run.wait(30)
    assert execution.state is ExecutionState.CANCELLED, harness.worker_logs()
    assert _reversals(harness, run.id) == [r.step for r in plan.reversals]
    assert plan.ends == f"cancelled, rollback {execution.rollback_status.value}"


def test_a_run_past_its_pivots_plan_reverses_nothing_and_neither_does_it(harness: Harness) -> None:
    run = harness.start("pivoted", {"plan": {"b": {"sleep": 2, "mark_begin": True, "fail": True}}})
    deadline = time.monotonic() + 20
    while not any(e.direction == "forward_begin" for e in harness.test_app.entries(run.id)):
        assert time.monotonic() < deadline, harness.worker_logs()
        time.sleep(0.05)
    unwind = harness.engine.plan(run.id, "unwind")
    assert unwind.reversals == () and unwind.past_pivot == ("a", "b")
    cancel = harness.engine.plan(run.id, "cancel")
    assert cancel.refused == "past pivot"
    with pytest.raises(InvalidStateError, match="pivot"):
        harness.engine.cancel(run.id)
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.rollback_status is RollbackStatus.NOT_APPLICABLE
    assert _reversals(harness, run.id) == []
    assert unwind.ends == "failed, rollback not_applicable"


def test_the_plan_of_a_stored_run_redacts_what_its_saga_marks(
    saga_engine: Any, saga_kit: Any
) -> None:
    def undo(ctx: Any) -> None:
        raise ConnectionError("vault down")

    def refuse(ctx: Any) -> None:
        raise ValueError("declined")

    saga_engine.register(
        Saga("marked_plan", sensitive=("card",))
        .step("hold", lambda ctx: {"card": ctx.input["card"], "id": 1}, compensate=undo)
        .step("charge", refuse)
    )
    run = saga_kit.run("marked_plan", {"card": "4111-1111"})
    assert run.state is ExecutionState.COMPENSATION_STUCK
    plan = saga_engine.plan(run.execution.id, "resume")
    assert [(r.step, r.result) for r in plan.reversals] == [
        ("hold", {"card": "[redacted]", "id": 1})
    ]
    assert plan.input == {"card": "[redacted]"}
    assert "4111" not in "\n".join(plan_lines(plan)) + plan_json(plan)
    with pytest.raises(SagaError, match="no plan for move 'retry'; moves: unwind, cancel"):
        saga_engine.plan(run.execution.id, "retry")
