"""``explore`` fails a saga at every point on the embedded default and finds the bugs a
hand-written test suite misses: five seeded bugs, each found at its point, each gone with
its fix; the example project explored clean within its budget."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from celery_saga import ExecutionState, Saga, path, step
from celery_saga.testing import ExplorationReport, Point, Timeline, explore


class Ledger:
    """The effects a run's steps had on the outside world, per run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, list[Any]] = defaultdict(list)
        self.balance: dict[str, int] = defaultdict(int)
        self.keys: set[str] = set()

    def add(self, run: str, thing: Any) -> None:
        with self.lock:
            self.held[run].append(thing)

    def discard(self, run: str, thing: Any) -> None:
        with self.lock:
            if thing in self.held[run]:  # a failed reservation holds nothing
                self.held[run].remove(thing)


ledger = Ledger()


def failing_ids(report: ExplorationReport) -> list[str]:
    return [failure.point.id for failure in report.failures]


# -- seed 1: a compensation that raises on a missing result -------------------------------
def charge(ctx: Any) -> dict[str, str]:
    return {"charge": f"CH-{ctx.execution_id}"}


def refund_assuming_a_result(ctx: Any) -> None:
    ledger.add(ctx.execution_id, ctx.forward_result["charge"])  # None when charge failed


def refund(ctx: Any) -> None:
    if ctx.forward_result is not None:  # charge failed: nothing was charged
        ledger.add(ctx.execution_id, ctx.forward_result["charge"])


def ship(ctx: Any) -> str:
    return "shipped"


def unship(ctx: Any) -> None:
    return None


def seed_missing_result(fixed: bool) -> Saga:
    compensation = refund if fixed else refund_assuming_a_result
    return (
        Saga(f"seed-missing-result-{fixed}")
        .step("charge", charge, compensate=compensation)
        .step("ship", ship, compensate=unship)
    )


@pytest.mark.parametrize("fixed", [False, True])
def test_a_compensation_that_raises_on_a_missing_result_is_found(fixed: bool) -> None:
    report = explore(seed_missing_result(fixed), {})
    if fixed:
        assert report.ok, str(report)
        return
    assert failing_ids(report) == ["fail:charge"], str(report)
    (problem,) = report.failures[0].problems
    assert "compensation_stuck" in problem and "TypeError" in problem


# -- seed 2: a pivot placed after an irreversible step ------------------------------------
def hold(ctx: Any) -> None:
    return None


def release(ctx: Any) -> None:
    return None


def email(ctx: Any) -> None:
    return None  # sent: no way to take it back


def seed_late_pivot(fixed: bool) -> Saga:
    saga = (
        Saga(f"seed-late-pivot-{fixed}").step("hold", hold, compensate=release).step("email", email)
    )
    if fixed:
        saga.pivot()
    saga.step("book", hold, compensate=release)
    if not fixed:
        saga.pivot()
    return saga.step("notify", ship)


@pytest.mark.parametrize("fixed", [False, True])
def test_a_pivot_placed_after_an_irreversible_step_is_found(fixed: bool) -> None:
    report = explore(seed_late_pivot(fixed), {})
    if fixed:
        assert report.ok, str(report)
        return
    assert "fail:book" in failing_ids(report), str(report)
    for failure in report.failures:
        assert all("'email' completed and has no compensation" in p for p in failure.problems)


# -- seed 3: a compensation that is not idempotent under redelivery -----------------------
def debit(ctx: Any) -> dict[str, int]:
    with ledger.lock:
        ledger.balance[ctx.execution_id] -= 1
    return {"debited": 1}


def credit_every_time(ctx: Any) -> None:
    if ctx.forward_result is None:
        return  # the debit failed: nothing to credit
    with ledger.lock:
        ledger.balance[ctx.execution_id] += 1


def credit_once(ctx: Any) -> None:
    if ctx.forward_result is None:
        return
    with ledger.lock:
        if ctx.idempotency_key in ledger.keys:
            return  # this reversal already credited: its message came again
        ledger.keys.add(ctx.idempotency_key)
        ledger.balance[ctx.execution_id] += 1


def balanced_after_an_unwind(point: Point, timeline: Timeline) -> None:
    if timeline.state is ExecutionState.FAILED:
        assert ledger.balance[timeline.execution.id] == 0, "the debit was credited back twice"


def seed_not_idempotent(fixed: bool) -> Saga:
    credit = credit_once if fixed else credit_every_time
    return (
        Saga(f"seed-not-idempotent-{fixed}")
        .step("debit", debit, compensate=credit)
        .step("ship", ship)
    )


@pytest.mark.parametrize("fixed", [False, True])
def test_a_compensation_that_is_not_idempotent_under_redelivery_is_found(fixed: bool) -> None:
    report = explore(seed_not_idempotent(fixed), {}, on_point=balanced_after_an_unwind)
    if fixed:
        assert report.ok, str(report)
        return
    assert failing_ids(report) == ["interrupt-reversal:debit"], str(report)
    assert "credited back twice" in report.failures[0].problems[0]


# -- seed 4: a wait whose timeout path has no compensation for a completed step ----------
def invoice(ctx: Any) -> None:
    return None


def void_invoice(ctx: Any) -> None:
    return None


def seed_timeout_path(fixed: bool) -> Saga:
    return (
        Saga(f"seed-timeout-path-{fixed}")
        .step("hold", hold, compensate=release)
        .step("invoice", invoice, compensate=void_invoice if fixed else None)
        .wait_for("paid", timeout=3600)
        .pivot()
        .step("ship", ship)
    )


@pytest.mark.parametrize("fixed", [False, True])
def test_a_wait_whose_timeout_leaves_a_completed_step_in_place_is_found(fixed: bool) -> None:
    report = explore(seed_timeout_path(fixed), {})
    if fixed:
        assert report.ok, str(report)
        return
    assert failing_ids(report) == ["timeout:paid", "cancel:paid"], str(report)
    assert "'invoice' completed and has no compensation" in report.failures[0].problems[0]


# -- seed 5: a for_each item whose compensation reads the wrong item ----------------------
def reserve_item(ctx: Any) -> None:
    ledger.add(ctx.execution_id, ctx.item)


def release_the_first_item(ctx: Any) -> None:
    ledger.discard(ctx.execution_id, ctx.input["items"][0])


def release_item(ctx: Any) -> None:
    ledger.discard(ctx.execution_id, ctx.item)


def seed_wrong_item(fixed: bool) -> Saga:
    undo = release_item if fixed else release_the_first_item
    return (
        Saga(f"seed-wrong-item-{fixed}")
        .for_each(lambda ctx: ctx.input["items"], step("reserve", reserve_item, compensate=undo))
        .step("pay", ship)
    )


def nothing_held_after_an_unwind(point: Point, timeline: Timeline) -> None:
    if timeline.state is ExecutionState.FAILED:
        assert ledger.held[timeline.execution.id] == [], "an item is still reserved"


@pytest.mark.parametrize("fixed", [False, True])
def test_a_for_each_compensation_that_reads_the_wrong_item_is_found(fixed: bool) -> None:
    saga = seed_wrong_item(fixed)
    items = {"items": ["a", "b", "c"]}
    report = explore(saga, items, on_point=nothing_held_after_an_unwind)
    if fixed:
        assert report.ok, str(report)
        return
    assert "fail:pay" in failing_ids(report), str(report)
    assert "fail:reserve:0" not in failing_ids(report)  # one item: the first is the right one


# -- control flow: branch paths, parallel groups, loops -----------------------------------
def more_to_pack(ctx: Any) -> bool:
    return len(ctx.iterations("pack")) >= 4


def control_flow() -> Saga:
    return (
        Saga("control-flow")
        .branch(
            "route",
            lambda ctx: "standard",
            path("standard", step("label", ship, compensate=unship)),
            path("express", step("courier", ship, compensate=unship), step("call", ship)),
        )
        .parallel("pick", step("left", ship, compensate=unship), step("right", ship))
        .do_until(more_to_pack, step("pack", ship, compensate=unship))
        .step("close", ship)
    )


def test_each_branch_path_parallel_member_and_loop_iteration_is_explored() -> None:
    report = explore(control_flow(), {}, pure=("right", "call", "close"))
    assert report.ok, str(report)
    ids = [p.id for p in report.points]
    assert "fail:label" in ids and "fail:left" in ids and "interrupt:right" in ids
    assert [i for i in ids if i.startswith("[route=express]")][:2] == [
        "[route=express] baseline",
        "[route=express] fail:courier",
    ]
    assert "[route=express] fail-reversal:courier" in ids
    assert {"fail:pack:0", "fail:pack:2", "fail:pack:3"} <= set(ids)
    assert "fail:pack:1" not in ids  # the first, a middle and the last iteration


# -- the explorer's own controls -----------------------------------------------------------
def test_a_failures_reproduction_explores_that_point_alone_and_fails_it() -> None:
    report = explore(seed_missing_result(False), {})
    (failure,) = report.failures
    assert failure.reproduction == "explore(seed-missing-result-False, input, only='fail:charge')"
    again = explore(seed_missing_result(False), {}, only=failure.point.id)
    assert [p.id for p in again.points] == ["fail:charge"]
    assert failing_ids(again) == ["fail:charge"]


def test_max_points_explores_the_first_points_in_order() -> None:
    every = explore(seed_missing_result(True), {})
    first = explore(seed_missing_result(True), {}, max_points=3)
    assert first.points == every.points[:3]
    assert first.left_out == len(every.points) - 3


def test_on_point_sees_every_point_with_its_timeline() -> None:
    seen: list[tuple[str, str]] = []

    def record(point: Point, timeline: Timeline) -> None:
        seen.append((point.id, timeline.state.value))

    report = explore(seed_missing_result(True), {}, on_point=record)
    assert [p for p, _ in seen] == [p.id for p in report.points]
    assert ("fail:ship", "failed") in seen and ("baseline", "completed") in seen


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_points": 0}, "max_points= takes a positive number of points, got 0"),
        ({"only": "fail:nowhere"}, "no point 'fail:nowhere' in this saga's exploration"),
        ({"on_point": "yes"}, "on_point= takes a callable"),
    ],
)
def test_bad_arguments_are_refused_clearly(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
        explore(seed_missing_result(True), {}, **arguments)


def test_the_saga_must_be_a_saga() -> None:
    with pytest.raises(TypeError, match="explore\\(\\) takes a Saga built with Saga"):
        explore("order", {})  # type: ignore[arg-type]


# -- the example project and the budget ----------------------------------------------------
def test_the_example_projects_order_saga_passes_every_point() -> None:
    """Its time: benchmarks/explore_time.py (the tests only catch a hang)."""
    from example_project.sagas import order, payment

    started = time.monotonic()
    report = explore(
        order,
        {"order_id": "X1", "items": ["a", "b", "c"]},
        sagas=[payment],
        signals={"approved": {"by": "ana"}},
    )
    elapsed = time.monotonic() - started
    assert report.ok, str(report)
    assert {"timeout:approved", "cancel:approved", "interrupt-reversal:reserve_item:2"} <= {
        p.id for p in report.points
    }
    assert elapsed < 120, f"{len(report.points)} points took {elapsed:.1f} s"


def ten_step_saga() -> Saga:
    saga = Saga("ten-steps")
    for index in range(10):
        saga.step(f"s{index}", ship, compensate=unship)
        if index in (3, 6):
            saga.wait_for(f"gate{index}", timeout=600)
    return saga


def test_a_ten_step_saga_with_two_waits_explores_every_point() -> None:
    """Its time is a benchmark's to tell (benchmarks/explore_time.py: under 10 s on the
    embedded default); here only a hang or a point explored over and over would fail."""
    report = explore(ten_step_saga(), {})
    assert report.ok, str(report)
    assert len(report.points) > 60
    assert report.seconds < 120, f"{len(report.points)} points took {report.seconds:.1f} s"


def test_the_kit_explores_too_and_gives_its_clock_back(saga_kit: Any, saga_clock: Any) -> None:
    from celery_saga import get_clock

    report = saga_kit.explore(seed_missing_result(True), {}, max_points=4)
    assert report.ok and len(report.points) == 4
    assert get_clock() is saga_clock
    saga_kit.engine.register(Saga("after").step("ship", ship))
    assert saga_kit.run("after").state is ExecutionState.COMPLETED  # its worker still runs


def charge_for_real(ctx: Any) -> dict[str, str]:
    raise AssertionError("the explorer called the card processor")


def test_fakes_replace_a_steps_body_by_name() -> None:
    calls: list[str] = []

    def fake_charge(ctx: Any) -> dict[str, str]:
        calls.append(ctx.execution_id)
        return {"charge": "fake"}

    saga = Saga("faked").step("charge", charge_for_real, compensate=refund).step("ship", ship)
    report = explore(saga, {}, fakes={"charge": fake_charge}, max_points=3)
    assert report.ok, str(report)
    assert len(calls) == 2  # the baseline and duplicate:charge (fail:charge calls no body)


def test_the_process_keeps_its_payload_codec() -> None:
    from celery_saga.store.codec import current_codec, use_codec

    before, sentinel = current_codec(), object()
    use_codec(sentinel)  # type: ignore[arg-type]
    try:
        explore(seed_missing_result(True), {}, max_points=1)
        assert current_codec() is sentinel
    finally:
        use_codec(before)


def test_an_exploration_is_quiet_but_one_point_explored_alone_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    explore(seed_missing_result(True), {}, max_points=2)
    assert not [r for r in caplog.records if "injected" in r.getMessage()]
    explore(seed_missing_result(True), {}, only="fail:charge")
    logged = "failure injected at point 'fail:charge'"
    assert [r for r in caplog.records if logged in r.getMessage()]
