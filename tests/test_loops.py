"""Loops (guarantees 1, 5, 6, 11, 12, 24): ``for_each``, ``do_until`` and ``do_while`` record
each iteration as ``name:<i>``, skip completed iterations on re-entry, journal their
conditions and items before anything they select runs, and unwind every iteration with its
own result and item."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_saga import (
    CompensationOutcome,
    DefinitionError,
    ExecutionState,
    RollbackStatus,
    Saga,
    SagaContext,
    SagaEngine,
    set_clock,
    step,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.testing import ControlledClock
from tests.conftest import Harness, unconsumed_app


def _ledger(harness: Harness, run_id: str, direction: str) -> list[tuple[str, str]]:
    return [
        (e.step, e.detail) for e in harness.test_app.entries(run_id) if e.direction == direction
    ]


def test_for_each_runs_every_item_in_order_with_its_own_item(harness: Harness) -> None:
    run = harness.start("batch", {"order": 90, "items": ["book", "lamp", "mug"]})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert [s.name for s in execution.steps] == ["open", "pack:0", "pack:1", "pack:2", "seal"]
    assert _ledger(harness, run.id, "forward")[1:4] == [
        ("pack:0", "item='book' iteration=0"),
        ("pack:1", "item='lamp' iteration=1"),
        ("pack:2", "item='mug' iteration=2"),
    ]
    assert execution.results["pack"] == {"packed": "mug", "iteration": 2}, "latest, by bare name"
    keys = {s.name: s.idempotency_key for s in execution.steps}
    assert keys["pack:1"] == f"{run.id}:pack:1:forward"


def test_a_failed_item_unwinds_every_iteration_with_its_own_item_and_result(
    harness: Harness,
) -> None:
    plan = {"pack:2": {"fail": True}}
    run = harness.start("batch", {"order": 91, "items": ["book", "lamp", "mug"], "plan": plan})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert execution.failure_reason == "ValueError: cannot pack 'mug'"
    assert _ledger(harness, run.id, "compensate") == [
        ("pack:2", "item='mug' iteration=2 result=None"),
        ("pack:1", "item='lamp' iteration=1 result={'packed': 'lamp', 'iteration': 1}"),
        ("pack:0", "item='book' iteration=0 result={'packed': 'book', 'iteration': 0}"),
        ("open", "{'step': 'open', 'attempt': 1}"),
    ]
    outcomes = Counter(s.compensation_status for s in execution.steps)
    assert outcomes == {CompensationOutcome.COMPENSATED: 4}
    undo_keys = [e.key for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert undo_keys[0] == f"{run.id}:pack:2:compensate"


def test_an_empty_for_each_moves_straight_on(harness: Harness) -> None:
    execution = harness.start("batch", {"order": 92, "items": []}).wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert [s.name for s in execution.steps] == ["open", "seal"]


def test_do_until_repeats_its_body_until_the_condition_holds(harness: Harness) -> None:
    execution = harness.start("polling", {"order": 93, "rounds": 3}).wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert [s.name for s in execution.steps] == ["poll:0", "poll:1", "poll:2", "report"]


def test_do_while_checks_before_each_iteration_and_may_run_none(harness: Harness) -> None:
    two = harness.start("guarded", {"order": 94, "rounds": 2}).wait(30)
    assert two.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert [s.name for s in two.steps] == ["check:0", "act:0", "check:1", "act:1", "end"]
    none = harness.start("guarded", {"order": 95, "rounds": 0}).wait(30)
    assert [s.name for s in none.steps] == ["end"]


def test_a_loop_that_exceeds_max_iterations_fails_clearly_and_unwinds_its_iterations(
    harness: Harness,
) -> None:
    run = harness.start("polling", {"order": 96, "rounds": 9})
    execution = run.wait(30)
    assert execution.state is ExecutionState.FAILED, harness.worker_logs()
    assert execution.failure_reason == (
        "LoopError: saga 'polling': do_until 'poll' wanted iteration 6, beyond max_iterations=5"
    )
    assert [s for s, _ in _ledger(harness, run.id, "compensate")] == [
        "poll:4",
        "poll:3",
        "poll:2",
        "poll:1",
        "poll:0",
    ]


# -- direct drive: journaling, re-entry, crashes -------------------------------------------


class Crash(BaseException):
    """Stands for the worker dying inside a body: nothing after it in the process runs."""


def _drive(engine: SagaEngine, run_id: str, saga: str, limit: int = 50) -> None:
    """Deliver the run's current position until it stops moving (one worker, in order)."""
    for _ in range(limit):
        record = engine.get(run_id).record
        if record.state is not ExecutionState.RUNNING:
            return
        before = (record.cursor, record.cursor_sub, record.version)
        engine.executor.run_node(NodeMessage(run_id, record.cursor, record.cursor_sub, 0, 1), saga)
        after = engine.get(run_id).record
        if (after.cursor, after.cursor_sub, after.version) == before:
            return
    raise AssertionError("the run did not settle")


def test_loop_decisions_are_journaled_before_their_effects(direct: SagaEngine) -> None:
    calls: Counter[str] = Counter()
    seen: list[Any] = []

    def items(ctx: SagaContext) -> list[str]:
        calls["items"] += 1
        return ["a", "b", "c"] if calls["items"] == 1 else ["changed"]

    def until(ctx: SagaContext) -> bool:
        calls[f"until:{ctx.iteration}"] += 1
        return ctx.iteration >= 2

    def body(ctx: SagaContext) -> Any:
        seen.append(ctx.step_name)
        return ctx.item

    saga = f"journal{uuid.uuid4().hex[:6]}"
    direct.register(
        Saga(saga).for_each(items, step("each", body)).do_until(until, step("again", body))
    )
    run = direct.start(saga)
    for _ in range(12):  # every message delivered twice: a re-run must take the same path
        record = direct.get(run.id).record
        if record.state is not ExecutionState.RUNNING:
            break
        message = NodeMessage(run.id, record.cursor, record.cursor_sub, 0, 1)
        direct.executor.run_node(message, saga)
        direct.executor.run_node(message, saga, redelivered=True)
    assert direct.get(run.id).state is ExecutionState.COMPLETED
    assert seen == ["each:0", "each:1", "each:2", "again:0", "again:1"]
    assert calls == {"items": 1, "until:1": 1, "until:2": 1}, "each choice made once"


def test_completed_iterations_are_skipped_when_the_node_is_re_entered(store_url: str) -> None:
    clock = ControlledClock(datetime(2031, 1, 1, tzinfo=timezone.utc))
    previous = set_clock(clock)
    ran: Counter[str] = Counter()
    crash_on = {"each:2"}

    def body(ctx: SagaContext) -> Any:
        ran[ctx.step_name] += 1
        if ctx.step_name in crash_on:
            crash_on.clear()
            raise Crash
        return ctx.item

    try:
        app = unconsumed_app("reenter")
        engine = SagaEngine(app, store_url=store_url)
        engine.ensure_schema()
        saga = f"reenter{uuid.uuid4().hex[:6]}"
        engine.register(Saga(saga).for_each(lambda ctx: [1, 2, 3, 4], step("each", body)))
        run = engine.start(saga)
        with pytest.raises(Crash):
            _drive(engine, run.id, saga)
        assert engine.get(run.id).record.cursor_sub == 2
        for earlier in (0, 1):  # stale copies of completed iterations change nothing
            engine.executor.run_node(NodeMessage(run.id, 0, earlier, 0, 1), saga, True)
        clock.advance(engine.settings.lease_seconds + 1)  # the dead worker's lease expires
        engine.executor.run_node(NodeMessage(run.id, 0, 2, 0, 1), saga, redelivered=True)
        _drive(engine, run.id, saga)
        execution = engine.get(run.id)
        assert execution.state is ExecutionState.COMPLETED
        assert ran == {"each:0": 1, "each:1": 1, "each:2": 2, "each:3": 1}
        assert execution.step("each:2").attempts == 2
        engine.db.dispose()
    finally:
        set_clock(previous)


def _failing_saga(engine: SagaEngine, build: Any) -> str:
    name = f"bad{uuid.uuid4().hex[:6]}"
    engine.register(build(Saga(name).step("first", lambda: 1, compensate=lambda: None)))
    return name


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (
            lambda s: s.for_each(lambda ctx: "abc", step("x", lambda: 1)),
            "LoopError: saga '{saga}': the items of for_each 'x' returned str 'abc'; "
            "for_each items must be a list",
        ),
        (
            lambda s: s.for_each(lambda ctx: [1, 2, 3], step("x", lambda: 1), max_iterations=2),
            "LoopError: saga '{saga}': the items of for_each 'x' returned 3 items, more than "
            "max_iterations=2",
        ),
        (
            lambda s: s.do_while(lambda ctx: "yes", step("x", lambda: 1)),
            "LoopError: saga '{saga}': the condition of do_while 'x' returned 'yes' (str); "
            "a loop condition must return True or False",
        ),
        (
            lambda s: s.do_until(lambda ctx: 1 / 0, step("x", lambda: 1)),
            "LoopError: saga '{saga}': the condition of do_until 'x' raised "
            "ZeroDivisionError: division by zero",
        ),
        (
            lambda s: s.for_each(lambda ctx: [{1, 2}], step("x", lambda: 1)),
            "PayloadError: saga '{saga}': the items of for_each 'x': cannot store a value",
        ),
    ],
)
def test_bad_loop_values_fail_the_run_with_a_clear_error_and_unwind_it(
    direct: SagaEngine, build: Any, reason: str
) -> None:
    saga = _failing_saga(direct, build)
    run = direct.start(saga)
    _drive(direct, run.id, saga)
    execution = direct.get(run.id)
    assert execution.state is ExecutionState.COMPENSATING, "failed, and its unwind begun"
    assert (execution.failure_reason or "").startswith(reason.format(saga=saga))
    # do_until runs its body once before its condition is first asked.
    ran = ["first", "x:0"] if "do_until" in reason else ["first"]
    assert [s.name for s in execution.steps] == ran, "nothing the failed choice selected ran"


def test_only_a_numeric_suffix_marks_an_iteration(direct: SagaEngine) -> None:
    undone: list[tuple[str, Any]] = []

    def undo_loop(ctx: SagaContext) -> None:
        undone.append(("loop", ctx.step_name))

    def undo_extra(ctx: SagaContext) -> None:
        undone.append(("extra", ctx.step_name))

    def boom() -> None:
        raise RuntimeError("boom")

    saga = f"suffix{uuid.uuid4().hex[:6]}"
    direct.register(
        Saga(saga)
        .for_each(lambda ctx: [1, 2], step("charge", lambda: 1, compensate=undo_loop))
        .step("charge:extra", lambda: 2, compensate=undo_extra)
        .step("boom", boom)
    )
    run = direct.start(saga)
    _drive(direct, run.id, saga)
    for _ in range(5):  # deliver the unwind's messages as a worker would
        execution = direct.get(run.id)
        if execution.state is not ExecutionState.COMPENSATING:
            break
        pending = [s for s in execution.steps if s.compensatable and not s.compensation_status]
        nxt = max(pending, key=lambda s: s.id)
        direct.executor.unwinder.run(run.id, nxt.name, nxt.compensation_attempts + 1)
    assert direct.get(run.id).rollback_status is RollbackStatus.COMPLETED
    assert undone == [("extra", "charge:extra"), ("loop", "charge:1"), ("loop", "charge:0")]


def test_loop_definitions_are_checked_when_built() -> None:
    with pytest.raises(DefinitionError, match="needs a callable items"):
        Saga("d").for_each(["a"], step("x", lambda: 1))
    with pytest.raises(DefinitionError, match="max_iterations must be an integer >= 1"):
        Saga("d").do_until(lambda ctx: True, step("x", lambda: 1), max_iterations=0)
    with pytest.raises(DefinitionError, match="needs a callable condition"):
        Saga("d").do_while(True, step("x", lambda: 1))  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="non-empty list of step"):
        Saga("d").do_until(lambda ctx: True, [])
    with pytest.raises(DefinitionError, match="reserved for loop iterations"):
        Saga("d").for_each(lambda ctx: [], step("x:1", lambda: 1))
    with pytest.raises(DefinitionError, match="'x' is used twice"):
        Saga("d").step("x", lambda: 1).for_each(lambda ctx: [], step("x", lambda: 1)).seal()
