"""The explorer's pure decisions: which failure points a baseline yields, in which order, and
what each body call does at a point (celery_saga/testing/points.py)."""

from __future__ import annotations

from celery_saga.records import ExecutionState
from celery_saga.testing.points import (
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
