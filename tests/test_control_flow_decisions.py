"""The pure decisions behind waits, loops and sub-sagas, and the definition helpers they use."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_saga import ExecutionRecord, ExecutionState, RollbackStatus, Saga, StepRecord, step
from celery_saga.decisions.children import (
    ChildReversalKind,
    ChildStep,
    Notify,
    decide_child_reversal,
    decide_child_step,
    decide_notification,
)
from celery_saga.decisions.loops import (
    LoopVerdict,
    condition_problem,
    items_problem,
    loop_position,
    loop_verdict,
    needs_condition,
)
from celery_saga.decisions.recovery import RecoveryKind, decide_recovery
from celery_saga.decisions.retry import plan_retry
from celery_saga.decisions.unwind import UnwindKind, next_unwind_step
from celery_saga.decisions.waits import (
    Arrival,
    SignalVerdict,
    Wake,
    decide_arrival,
    decide_signal,
    decide_wake,
)
from celery_saga.definition.nodes import LoopKind, split_iteration
from celery_saga.records import StepStatus, completed_results
from celery_saga.runtime.keys import record_key

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
S = ExecutionState


def run(state: S = S.RUNNING, cursor: int = 1, **changes: object) -> ExecutionRecord:
    stamp = NOW - timedelta(minutes=5)
    base = ExecutionRecord(
        "r", "saga", "h", state, cursor, 0, {}, None, None, None, None, None, 1, stamp, stamp
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def record(name: str, record_id: int = 1, **changes: object) -> StepRecord:
    base = StepRecord(
        record_id, "r", name, 1, 0, StepStatus.COMPLETED, 1, f"r:{name}:0:forward", True
    )
    return replace(base, **changes)  # type: ignore[arg-type]


# -- iterations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("charge:2", ("charge", 2)),
        ("charge:extra", ("charge:extra", None)),
        ("payment:charge:10", ("payment:charge", 10)),
        ("charge", ("charge", None)),
        (":3", (":3", None)),
    ],
)
def test_only_a_numeric_suffix_is_an_iteration(name: str, split: tuple[str, int | None]) -> None:
    assert split_iteration(name) == split


def test_iteration_keys_use_the_iteration_as_occurrence() -> None:
    assert record_key("r1", "charge:2", "forward") == "r1:charge:2:forward"
    assert record_key("r1", "charge", "compensate") == "r1:charge:0:compensate"
    assert record_key("r1", "charge:extra", "forward") == "r1:charge:extra:0:forward"


def test_find_step_prefers_exact_names_and_maps_only_numeric_iterations() -> None:
    loop, extra = step("charge", lambda: 1), step("charge:extra", lambda: 2)
    definition = Saga("f").for_each(lambda ctx: [], loop).step(extra).seal()
    assert definition.find_step("charge:3") is loop
    assert definition.find_step("charge:extra") is extra
    assert definition.find_step("charge:x1") is None


def test_the_bare_name_of_a_loop_step_reads_its_latest_iteration() -> None:
    steps = [
        record("poll:0", 1, result="first"),
        record("poll:10", 3, result="eleventh"),
        record("poll:2", 2, result="third"),
        record("poll:11", 4, status=StepStatus.FAILED),
    ]
    results = completed_results(steps)
    assert results["poll"] == "eleventh", "by iteration, not by record order or text"
    assert results["poll:0"] == "first"


def test_iterations_are_reversed_by_their_body_steps_compensation() -> None:
    steps = [record("pack:0", 1), record("pack:1", 2)]
    plan = next_unwind_step(steps, False, {"pack"})
    assert (plan.kind, plan.record) == (UnwindKind.COMPENSATE, steps[1])
    assert next_unwind_step(steps, False, set()).kind is UnwindKind.HALT_VANISHED


# -- loops ----------------------------------------------------------------------------------


@given(st.integers(0, 1000), st.integers(1, 50))
def test_a_loop_position_is_iteration_and_body_index(sub: int, body: int) -> None:
    iteration, index = loop_position(sub, body)
    assert iteration * body + index == sub and 0 <= index < body


@given(st.integers(0, 20), st.booleans(), st.integers(1, 20))
def test_loop_verdicts(iteration: int, condition: bool, most: int) -> None:
    until = loop_verdict(LoopKind.UNTIL, iteration, condition, most)
    while_ = loop_verdict(LoopKind.WHILE, iteration, condition, most)
    wants_until = iteration == 0 or not condition
    assert (until is LoopVerdict.DONE) == (not wants_until)
    assert (while_ is LoopVerdict.DONE) == (not condition)
    for verdict, wants in ((until, wants_until), (while_, condition)):
        if wants:
            expected = LoopVerdict.EXCEEDED if iteration >= most else LoopVerdict.RUN
            assert verdict is expected


def test_do_until_asks_its_condition_only_after_the_first_iteration() -> None:
    assert not needs_condition(LoopKind.UNTIL, 0)
    assert needs_condition(LoopKind.UNTIL, 1)
    assert needs_condition(LoopKind.WHILE, 0)


@pytest.mark.parametrize("value", [1, 0, None, "yes", [True]])
def test_a_condition_must_be_exactly_a_bool(value: object) -> None:
    assert condition_problem(value) is not None
    assert condition_problem(True) is None and condition_problem(False) is None


@pytest.mark.parametrize("value", ["abc", {"a": 1}, {1, 2}, (i for i in range(2)), 3, None])
def test_for_each_items_must_be_a_list(value: object) -> None:
    assert "must be a list" in (items_problem(value, 10) or "")
    assert items_problem([1, 2], 2) is None and items_problem((1,), 2) is None
    assert "more than max_iterations=2" in (items_problem([1, 2, 3], 2) or "")


# -- waits ----------------------------------------------------------------------------------


def test_arrival_parks_or_passes_only_at_its_own_position() -> None:
    assert decide_arrival(run(), 1, "h", False) is Arrival.PARK
    assert decide_arrival(run(), 1, "h", True) is Arrival.PASS
    assert decide_arrival(run(cursor=2), 1, "h", False) is Arrival.REFUSE
    assert decide_arrival(run(S.WAITING), 1, "h", False) is Arrival.REFUSE
    assert decide_arrival(run(), 1, "other", False) is Arrival.REFUSE
    assert decide_arrival(None, 1, "h", False) is Arrival.REFUSE


@pytest.mark.parametrize(
    ("execution", "already", "verdict"),
    [
        (run(S.WAITING, cursor=3), False, SignalVerdict.RESUME),
        (run(S.WAITING, cursor=2), False, SignalVerdict.STORE),  # parked at another gate
        (run(S.RUNNING, cursor=3), False, SignalVerdict.STORE),  # not parked yet
        (run(S.WAITING, cursor=3), True, SignalVerdict.DUPLICATE),
        (run(S.COMPLETED), False, SignalVerdict.NOT_ACCEPTING),
        (run(S.FAILED), False, SignalVerdict.NOT_ACCEPTING),
        (run(S.COMPENSATING), False, SignalVerdict.NOT_ACCEPTING),
        (run(S.COMPENSATION_STUCK), False, SignalVerdict.NOT_ACCEPTING),
    ],
)
def test_signal_verdicts(execution: ExecutionRecord, already: bool, verdict: SignalVerdict) -> None:
    assert decide_signal(execution, 3, already) is verdict


def test_a_deadline_fires_only_once_passed_and_only_without_the_signal() -> None:
    parked = run(S.WAITING, wake_at=NOW)
    assert decide_wake(parked, False, NOW) is Wake.TIME_OUT, "the deadline is inclusive"
    assert decide_wake(parked, False, NOW - timedelta(microseconds=1)) is Wake.NOTHING
    assert decide_wake(parked, True, NOW) is Wake.RESUME
    assert decide_wake(run(S.COMPENSATING, wake_at=NOW), False, NOW) is Wake.NOTHING
    assert decide_wake(run(S.WAITING, wake_at=None), False, NOW) is Wake.NOTHING


# -- sub-sagas ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("child", "step_kind"),
    [
        (None, ChildStep.START),
        (run(S.RUNNING), ChildStep.WAIT),
        (run(S.WAITING), ChildStep.WAIT),
        (run(S.COMPENSATING), ChildStep.WAIT),
        (run(S.FAILED), ChildStep.WAIT),  # recorded failed, its unwind still owed
        (run(S.COMPLETED), ChildStep.COMPLETE),
        (run(S.FAILED, rollback_status=RollbackStatus.COMPLETED), ChildStep.FAIL),
        (run(S.COMPENSATION_STUCK, rollback_status=RollbackStatus.STUCK), ChildStep.FAIL),
    ],
)
def test_child_step_decisions(child: ExecutionRecord | None, step_kind: ChildStep) -> None:
    assert decide_child_step(child) is step_kind


@pytest.mark.parametrize(
    ("child", "kind", "reason"),
    [
        (None, ChildReversalKind.HALT, "no longer exists"),
        (run(S.RUNNING), ChildReversalKind.HALT, "is still running"),
        (run(S.WAITING), ChildReversalKind.HALT, "is still waiting"),
        (run(S.COMPLETED), ChildReversalKind.START_UNWIND, None),
        (run(S.COMPLETED, committed_at=NOW), ChildReversalKind.HALT, "past its pivot"),
        (run(S.COMPENSATING), ChildReversalKind.WAIT, None),
        (run(S.FAILED), ChildReversalKind.WAIT, None),
        (
            run(S.COMPENSATION_STUCK, rollback_reason="undo failed"),
            ChildReversalKind.HALT,
            "parked mid-unwind: undo failed",
        ),
        (
            run(S.FAILED, rollback_status=RollbackStatus.STUCK),
            ChildReversalKind.HALT,
            "was abandoned",
        ),
        (run(S.FAILED, rollback_status=RollbackStatus.COMPLETED), ChildReversalKind.SETTLED, None),
        (
            run(S.FAILED, rollback_status=RollbackStatus.NOT_APPLICABLE),
            ChildReversalKind.SETTLED,
            None,
        ),
        (
            run(S.FAILED, rollback_status=RollbackStatus.NOT_APPLICABLE, committed_at=NOW),
            ChildReversalKind.HALT,
            "past its pivot",
        ),
    ],
)
def test_child_reversal_decisions(
    child: ExecutionRecord | None, kind: ChildReversalKind, reason: str | None
) -> None:
    decision = decide_child_reversal(child, "c1")
    assert decision.kind is kind
    if reason is not None:
        assert reason in (decision.reason or "")


def test_a_settled_child_notifies_whatever_its_parent_waits_on() -> None:
    held = record("child", status=StepStatus.RUNNING, child_execution_id="c1")
    assert decide_notification(run(), held) is Notify.NODE
    assert decide_notification(run(cursor=2), held) is Notify.NOTHING
    done = replace(held, status=StepStatus.COMPLETED, completed_at=NOW)
    assert decide_notification(run(S.COMPENSATING), done) is Notify.COMPENSATION
    settled = replace(done, compensation_status="compensated")
    assert decide_notification(run(S.COMPENSATING), settled) is Notify.NOTHING
    assert decide_notification(run(S.COMPLETED), done) is Notify.NOTHING
    assert decide_notification(None, held) is Notify.NOTHING


# -- recovery -------------------------------------------------------------------------------


def test_a_run_waiting_on_a_live_child_recovers_the_child() -> None:
    held = record("child", status=StepStatus.RUNNING, child_execution_id="c1")
    args = ({"child"}, NOW, timedelta(seconds=60))
    live = run(S.RUNNING, updated_at=NOW - timedelta(hours=1))
    assert decide_recovery(run(), [held], *args, run(S.RUNNING)).kind is RecoveryKind.RECOVER_CHILD
    settled = run(S.COMPLETED)
    assert decide_recovery(run(), [held], *args, settled).kind is RecoveryKind.REPUBLISH_POSITION
    assert decide_recovery(run(), [held], *args, None).kind is RecoveryKind.REPUBLISH_POSITION
    unwinding = replace(held, status=StepStatus.COMPLETED)
    parent = run(S.COMPENSATING)
    assert (
        decide_recovery(parent, [unwinding], *args, live).kind
        is RecoveryKind.REPUBLISH_COMPENSATION
    )
    assert (
        decide_recovery(parent, [unwinding], *args, run(S.COMPENSATING)).kind
        is RecoveryKind.RECOVER_CHILD
    )


def test_a_run_recorded_failed_before_its_unwind_started_is_reopened() -> None:
    args = (set(), NOW, timedelta(seconds=60))
    assert decide_recovery(run(S.FAILED), [], *args).kind is RecoveryKind.REOPEN_UNWIND
    done = run(S.FAILED, rollback_status=RollbackStatus.COMPLETED)
    assert decide_recovery(done, [], *args).kind is RecoveryKind.NOTHING
    assert decide_recovery(run(S.WAITING), [], *args).kind is RecoveryKind.NOTHING


@given(
    attempt=st.integers(1, 50),
    attempts=st.integers(1, 50),
    countdown=st.floats(0, 600),
    max_retries=st.one_of(st.none(), st.integers(0, 50)),
)
def test_a_requested_retry_follows_the_tasks_limit_and_an_error_the_steps(
    attempt: int, attempts: int, countdown: float, max_retries: int | None
) -> None:
    requested = plan_retry(attempt, attempts, (countdown, max_retries), (0.5, 30.0), 0.0)
    # As Celery's ``self.retry()``: another attempt while attempt <= max_retries (None: no
    # limit), after exactly the countdown asked for; the step's own ``retry`` plays no part.
    if max_retries is not None and attempt > max_retries:
        assert requested is None
    else:
        assert requested == countdown
    raised = plan_retry(attempt, attempts, None, (0.5, 30.0), 0.0)
    assert (raised is None) == (attempt >= attempts)
    if raised is not None:
        assert raised == min(0.5 * 2.0 ** (attempt - 1), 30.0)
