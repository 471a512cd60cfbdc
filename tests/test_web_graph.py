"""The web view's graph: each node kind drawn as boxes whose colour follows the run's
records (pure: definitions from the builder, runs as ``timeline.describe`` gives them)."""

from __future__ import annotations

from typing import Any

from celery_saga import Saga, path, step
from celery_saga.web.graph import NOT_REACHED, Box, draw, group_status


def _fwd(ctx: Any) -> None:
    return None


def _step(name: str, status: str, compensation: str | None = None, **more: Any) -> dict[str, Any]:
    base, _, index = name.partition(":")
    return {
        "name": name,
        "step": base,
        "iteration": int(index) if index else None,
        "status": status,
        "attempts": more.get("attempts", 1),
        "compensation": (
            {"status": compensation, "attempts": 1, "total_attempts": 1} if compensation else None
        ),
        "child": more.get("child"),
    }


def _run(*steps: dict[str, Any], state: str = "running", **more: Any) -> dict[str, Any]:
    return {"state": state, "steps": list(steps), "signals": [], "committed_at": None, **more}


def _flat(boxes: tuple[Box, ...]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for box in boxes:
        found[box.label] = (box.kind, box.status)
        found.update(_flat(box.children))
    return found


def test_a_reversed_step_shows_its_reversal_and_an_unreached_one_shows_not_reached() -> None:
    definition = Saga("g1").step("a", _fwd, compensate=_fwd).step("b", _fwd).step("c", _fwd).seal()
    run = _run(_step("a", "completed", "compensated", attempts=3), _step("b", "failed"))
    boxes = draw(definition, run)
    assert [(b.label, b.status) for b in boxes] == [
        ("a", "compensated"),
        ("b", "failed"),
        ("c", NOT_REACHED),
    ]
    assert boxes[0].detail == "3 attempts"


def test_groups_take_the_most_urgent_status_inside_them() -> None:
    definition = (
        Saga("g2")
        .parallel("fan", step("p1", _fwd), step("p2", _fwd))
        .branch(
            "size", lambda ctx: "big", path("big", step("x", _fwd)), path("small", step("y", _fwd))
        )
        .seal()
    )
    run = _run(_step("p1", "completed"), _step("p2", "running"), _step("x", "completed"))
    boxes = draw(definition, run)
    assert boxes[0].kind == "parallel" and boxes[0].side_by_side
    assert boxes[0].status == "running"
    paths = {p.label: (p.status, p.detail) for p in boxes[1].children}
    assert paths == {"big": ("completed", "taken"), "small": (NOT_REACHED, "")}
    assert group_status(["completed", "compensation_failed", "failed"]) == "compensation_failed"


def test_a_loop_shows_its_latest_iteration_and_how_many_ran() -> None:
    definition = (
        Saga("g3")
        .do_until(lambda ctx: True, step("poll", _fwd), max_iterations=5)
        .for_each(lambda ctx: [1, 2], step("pack", _fwd))
        .seal()
    )
    run = _run(
        _step("poll:1", "failed"),
        _step("poll:0", "completed"),
        _step("pack:0", "completed"),
    )
    loop, each = draw(definition, run)
    assert (loop.kind, each.kind) == ("loop", "for_each")
    assert (loop.children[0].status, loop.children[0].detail) == ("failed", "2 iteration(s)")
    assert each.children[0].status == "completed"


def test_a_wait_is_waiting_at_the_cursor_and_done_once_its_event_arrived() -> None:
    definition = Saga("g4").step("a", _fwd).wait_for("go").wait_for("again", timeout=30).seal()
    waiting = draw(definition, _run(_step("a", "completed"), state="waiting", cursor=1))
    assert [b.status for b in waiting] == ["completed", "waiting", NOT_REACHED]
    assert waiting[2].detail == "timeout 30 s"
    signals = [{"event": "go"}]
    passed = draw(
        definition, _run(_step("a", "completed"), state="waiting", cursor=2, signals=signals)
    )
    assert [b.status for b in passed] == ["completed", "completed", "waiting"]


def test_a_sub_saga_links_to_its_child_run_and_a_pivot_shows_the_commit() -> None:
    definition = Saga("g5").sub_saga("kid").pivot().step("z", _fwd).seal()
    child = _step("kid", "completed", child={"id": "child-run-1"})
    sub, pivot, _ = draw(definition, _run(child, committed_at="2026-01-01T00:00:00+00:00"))
    assert (sub.kind, sub.status, sub.link) == ("sub_saga", "completed", "child-run-1")
    assert (pivot.kind, pivot.status) == ("pivot", "completed")
    assert _flat(draw(definition, _run()))["pivot"] == ("pivot", NOT_REACHED)


def test_a_failed_step_that_was_compensated_shows_its_failure_and_its_reversal() -> None:
    definition = Saga("g6").step("a", _fwd, compensate=_fwd).step("b", _fwd, compensate=_fwd).seal()
    run = _run(_step("a", "completed", "compensated"), _step("b", "failed", "compensated"))
    done_then_undone, failed_then_undone = draw(definition, run)
    assert (done_then_undone.status, failed_then_undone.status) == ("compensated", "compensated")
    assert (done_then_undone.forward, failed_then_undone.forward) == ("completed", "failed")


def test_a_reversal_counts_its_attempts_before_a_resume_too() -> None:
    definition = Saga("g7").step("a", _fwd, compensate=_fwd).step("b", _fwd).seal()
    resumed = _step("a", "completed", "compensated")
    resumed["compensation"] = {"status": "compensated", "attempts": 1, "total_attempts": 5}
    (box, _) = draw(definition, _run(resumed, _step("b", "failed")))
    assert box.detail == "5 reversal attempts"
