"""The explorer's pure decisions: which failure points a baseline yields, in which order, what
each body call does at a point (celery_saga/testing/points.py), and which invariants a run
breaks (celery_saga/testing/invariants.py)."""

from __future__ import annotations

from datetime import datetime, timezone

from celery_saga.records import (
    CompensationOutcome,
    Execution,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    StepRecord,
    StepStatus,
)
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.testing.invariants import Observed, problems
from celery_saga.testing.points import (
    Expected,
    Fault,
    Gate,
    Injection,
    Point,
    Site,
    chosen_iterations,
    expected_end,
    injection,
    points_of,
)

SITES = (
    Site("reserve", 0, 1, True),
    Site("charge", 1, 2, True),
    Site("ship", 4, 1, False),
)
GATES = (Gate("approved", 2, 60.0), Gate("paid", 3, None))


def test_points_come_in_the_order_the_run_meets_them_with_each_retry_count() -> None:
    ids = [p.id for p in points_of(SITES, GATES, pivot=None)]
    assert ids == [
        "baseline",
        "fail:reserve",
        "duplicate:reserve",
        "interrupt:reserve",
        "fail-reversal:reserve",
        "duplicate-reversal:reserve",
        "interrupt-reversal:reserve",
        "fail:charge@1",
        "fail:charge",
        "duplicate:charge",
        "interrupt:charge",
        "fail-reversal:charge",
        "duplicate-reversal:charge",
        "interrupt-reversal:charge",
        "signal:approved",
        "timeout:approved",
        "cancel:approved",
        "signal:paid",  # no deadline: nothing to time out
        "cancel:paid",
        "fail:ship",
        "duplicate:ship",
        "interrupt:ship",
    ]
    assert ids == [p.id for p in points_of(SITES, GATES, pivot=None)]


def test_past_the_pivot_nothing_is_reversed_nor_cancelled() -> None:
    points = points_of(SITES, GATES, pivot=2)
    assert not [p for p in points if p.target == "approved" and p.fault is Fault.CANCEL_AT_GATE]
    assert "fail-reversal:charge" in [p.id for p in points]
    failed_ship = next(p for p in points if p.id == "fail:ship")
    assert expected_end(failed_ship, SITES, GATES, 2).unwound is False
    timeout = next(p for p in points if p.id == "timeout:approved")
    assert expected_end(timeout, SITES, GATES, 2) == expected_end(failed_ship, SITES, GATES, 2)


def test_a_reversal_fault_is_reached_through_the_last_steps_failure() -> None:
    points = {p.id: p for p in points_of(SITES, GATES, pivot=None)}
    assert points["fail-reversal:reserve"].trigger == "ship"
    assert points["fail-reversal:charge"].trigger == "ship"
    before_the_pivot = {p.id: p for p in points_of(SITES, GATES, pivot=2)}
    assert before_the_pivot["fail-reversal:reserve"].trigger == "charge"
    last = points_of(SITES[:2], (), pivot=None)
    assert {p.id: p for p in last}["fail-reversal:charge"].trigger == "charge"


def test_loops_are_explored_at_the_first_a_middle_and_the_last_iteration() -> None:
    sites = [Site(f"pick:{i}", 0, 1, True) for i in range(7)]
    assert [s.name for s in chosen_iterations(sites)] == ["pick:0", "pick:3", "pick:6"]
    assert [s.name for s in chosen_iterations(sites[:1])] == ["pick:0"]


def calls(point: Point, record: str, reversal: bool = False) -> list[Injection]:
    return [injection(point, record, reversal, n) for n in (1, 2)]


def test_each_call_of_a_body_does_what_its_point_says() -> None:
    flaky = Point(Fault.STEP_FAILS, "charge", failures=1, retry=2)
    assert [injection(flaky, "charge", False, n) for n in (1, 2)] == [
        Injection.RAISE,
        Injection.RUN,
    ]
    assert injection(flaky, "reserve", False, 1) is Injection.RUN
    stuck = Point(Fault.REVERSAL_FAILS, "reserve", trigger="charge")
    assert injection(stuck, "charge", False, 5) is Injection.RAISE
    assert injection(stuck, "reserve", True, 9) is Injection.RAISE
    assert injection(stuck, "reserve", False, 1) is Injection.RUN
    copied = Point(Fault.DUPLICATE_REVERSAL, "reserve", trigger="charge")
    assert [injection(copied, "reserve", True, n) for n in (1, 2)] == [
        Injection.COPY,
        Injection.RUN,
    ]
    cut = Point(Fault.INTERRUPT, "ship")
    assert [injection(cut, "ship", False, n) for n in (1, 2)] == [
        Injection.INTERRUPT,
        Injection.RUN,
    ]
    assert injection(None, "ship", False, 1) is Injection.RUN


def test_how_each_point_must_end() -> None:
    def end(point_id: str) -> tuple[ExecutionState, bool, str | None]:
        point = next(p for p in points_of(SITES, GATES, None) if p.id == point_id)
        expected = expected_end(point, SITES, GATES, None)
        return expected.state, expected.unwound, expected.parks_on

    assert end("baseline") == (ExecutionState.COMPLETED, False, None)
    assert end("fail:charge@1") == (ExecutionState.COMPLETED, False, None)
    assert end("fail:charge") == (ExecutionState.FAILED, True, None)
    assert end("fail-reversal:reserve") == (ExecutionState.FAILED, True, "reserve")
    assert end("cancel:approved") == (ExecutionState.CANCELLED, True, None)
    assert end("interrupt:ship") == (ExecutionState.COMPLETED, False, None)


def test_a_branch_paths_points_name_the_path() -> None:
    points = points_of(SITES, (), None, (("route", "express"),), frozenset({"ship"}))
    assert [p.id for p in points] == [
        "[route=express] fail:ship",
        "[route=express] duplicate:ship",
        "[route=express] interrupt:ship",
    ]


# -- the invariants, on runs built by hand (celery_saga/testing/invariants.py) ------------
AT = datetime(2030, 1, 1, tzinfo=timezone.utc)


def run(*steps: StepRecord, committed: bool = False) -> Execution:
    record = ExecutionRecord(
        "r1", "order", "h", ExecutionState.FAILED, 3, 0, {}, "ValueError: no",
        RollbackStatus.COMPLETED, None, AT if committed else None, None, 1, AT, AT,
    )  # fmt: skip
    return Execution(record, steps)


def record(
    id: int, name: str, outcome: CompensationOutcome | None, compensatable: bool = True
) -> StepRecord:
    return StepRecord(
        id, "r1", name, id, 0, StepStatus.COMPLETED, 1, f"r1:{name}:0:forward", compensatable,
        compensation_status=outcome,
    )  # fmt: skip


def reversed_rows(*names: str) -> list[HistoryEntry]:
    return [HistoryEntry(AT, Kind.REVERSAL_COMPLETED.value, step=name) for name in names]


FAILED = Expected(ExecutionState.FAILED, unwound=True)
DONE = CompensationOutcome.COMPENSATED


def test_a_clean_unwind_breaks_nothing() -> None:
    seen = Observed(run(record(1, "a", DONE), record(2, "b", DONE)), reversed_rows("b", "a"), {})
    assert problems(Point(Fault.STEP_FAILS, "c"), FAILED, seen, frozenset()) == []


def test_a_reversal_run_twice_or_out_of_order_is_named() -> None:
    twice = Observed(run(record(1, "a", DONE)), reversed_rows("a", "a"), {})
    assert problems(Point(Fault.NONE), FAILED, twice, frozenset()) == ["'a' was reversed 2 times"]
    order = Observed(run(record(1, "a", DONE), record(2, "b", DONE)), reversed_rows("a", "b"), {})
    (problem,) = problems(Point(Fault.NONE), FAILED, order, frozenset())
    assert "not reverse start order ['b', 'a']" in problem


def test_a_step_left_unreversed_or_reversed_past_the_pivot_is_named() -> None:
    left = Observed(run(record(1, "a", None)), [], {})
    assert problems(Point(Fault.NONE), FAILED, left, frozenset()) == [
        "'a' (completed) was not reversed: no outcome"
    ]
    past = Observed(run(record(1, "a", DONE), committed=True), reversed_rows("a"), {})
    assert "'a' was reversed past the pivot" in problems(
        Point(Fault.NONE), FAILED, past, frozenset()
    )


def test_a_body_that_ran_twice_is_named_unless_its_point_interrupted_it() -> None:
    seen = Observed(run(record(1, "a", DONE)), reversed_rows("a"), {("a", True): 2})
    assert problems(Point(Fault.NONE), FAILED, seen, frozenset()) == [
        "the compensation of 'a' ran to its end 2 times"
    ]
    cut = Point(Fault.INTERRUPT_REVERSAL, "a", trigger="b")
    assert problems(cut, FAILED, seen, frozenset()) == []


def test_an_irreversible_step_left_in_place_by_an_unwind_is_named_unless_pure() -> None:
    email = record(1, "email", None, compensatable=False)
    seen = Observed(run(email, record(2, "b", DONE)), reversed_rows("b"), {})
    (problem,) = problems(Point(Fault.NONE), FAILED, seen, frozenset())
    assert problem.startswith("'email' completed and has no compensation")
    assert problems(Point(Fault.NONE), FAILED, seen, frozenset({"email"})) == []
