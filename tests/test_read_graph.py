"""A run's graph, the one builder every view draws: each node kind with the status its
records give it, in the one vocabulary (pure: definitions from the builder, step records
as the read model's values)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from celery_saga import Saga, path, step
from celery_saga.inspect import GraphNode, ReversalView, StepView
from celery_saga.inspect.graph import build, flatten
from celery_saga.inspect.vocabulary import NOT_RUN, PARTLY_RUN, group_status
from celery_saga.records import ExecutionRecord, ExecutionState

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _fwd(ctx: Any) -> None:
    return None


def _step(
    name: str, status: str, compensation: str | None = None, node: int = 0, **more: Any
) -> StepView:
    base, _, index = name.partition(":")
    reversal = None
    if compensation:
        total = more.get("total_attempts", 1)
        reversal = ReversalView(compensation, None, 1, total, AT, None)
    return StepView(
        name=name,
        step=base,
        iteration=int(index) if index else None,
        node=node,
        within=None,
        status=status,
        attempts=more.get("attempts", 1),
        idempotency_key=f"k-{name}",
        started_at=AT,
        completed_at=None,
        error=None,
        result=None,
        holder=None,
        compensatable=True,
        compensation=reversal,
        child=more.get("child"),
    )


def _record(state: str = "running", cursor: int = 0, **more: Any) -> ExecutionRecord:
    return ExecutionRecord(
        "run-1", "g", "h", ExecutionState(state), cursor, 0, {}, None, None, None,
        more.get("committed_at"), None, 1, AT, AT,
    )  # fmt: skip


def _flat(nodes: tuple[GraphNode, ...]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for node in nodes:
        found[node.name] = (node.kind, node.status)
        found.update(_flat(node.children))
    return found


def test_a_reversed_step_shows_its_reversal_and_an_unreached_one_shows_not_run() -> None:
    definition = Saga("g1").step("a", _fwd, compensate=_fwd).step("b", _fwd).step("c", _fwd).seal()
    steps = [_step("a", "completed", "compensated", 0, attempts=3), _step("b", "failed", node=1)]
    nodes = build(definition, _record(), steps)
    assert [(n.name, n.status) for n in nodes] == [
        ("a", "completed -> compensated"),
        ("b", "failed"),
        ("c", NOT_RUN),
    ]
    assert nodes[0].detail == "3 attempts"
    assert (nodes[0].outcome, nodes[0].forward, nodes[0].reversal) == (
        "compensated",
        "completed",
        "compensated",
    )


def test_groups_take_the_most_urgent_status_inside_them() -> None:
    definition = (
        Saga("g2")
        .parallel("fan", step("p1", _fwd), step("p2", _fwd))
        .branch(
            "size", lambda ctx: "big", path("big", step("x", _fwd)), path("small", step("y", _fwd))
        )
        .seal()
    )
    steps = [
        _step("p1", "completed", node=0),
        _step("p2", "running", node=0),
        _step("x", "completed", node=1),
    ]
    fan, size = build(definition, _record(), steps)
    assert fan.kind == "parallel" and fan.side_by_side
    assert fan.status == "running"
    assert (size.status, size.detail) == ("completed", "path 'big' taken, not small")
    assert [c.name for c in size.children] == ["x"]
    assert group_status(["completed", "compensation_failed", "failed"]) == "compensation_failed"
    assert group_status(["completed -> compensated", "failed"]) == "failed"
    assert group_status(["completed", NOT_RUN]) == PARTLY_RUN
    assert group_status([NOT_RUN, NOT_RUN]) == NOT_RUN


def test_a_loop_shows_its_latest_iteration_and_how_many_ran() -> None:
    definition = (
        Saga("g3")
        .do_until(lambda ctx: True, step("poll", _fwd), max_iterations=5)
        .for_each(lambda ctx: [1, 2], step("pack", _fwd))
        .seal()
    )
    steps = [
        _step("poll:0", "completed", node=0),
        _step("poll:1", "failed", node=0),
        _step("pack:0", "completed", node=1),
    ]
    loop, each = build(definition, _record(), steps)
    assert (loop.kind, each.kind) == ("loop", "for_each")
    assert (loop.status, loop.detail) == ("failed", "2 iterations run")
    assert (loop.children[0].status, loop.children[0].iterations) == ("failed", 2)
    assert (each.children[0].status, each.detail) == ("completed", "1 item run")


def test_a_wait_is_waiting_at_the_cursor_signalled_once_its_event_arrived() -> None:
    from celery_saga.inspect import SignalView

    definition = Saga("g4").step("a", _fwd).wait_for("go").wait_for("again", timeout=30).seal()
    steps = [_step("a", "completed")]
    waiting = build(definition, _record("waiting", cursor=1), steps)
    assert [n.status for n in waiting] == ["completed", "waiting", NOT_RUN]
    assert waiting[2].detail == "event 'again', deadline 30 s"
    signals = [SignalView("go", None, AT)]
    passed = build(definition, _record("waiting", cursor=2), steps, signals)
    assert [n.status for n in passed] == ["completed", "signalled", "waiting"]
    assert passed[1].detail is not None and AT.isoformat() in passed[1].detail


def test_a_wait_left_by_its_deadline_reads_timed_out() -> None:
    from celery_saga.inspect import HistoryRow

    definition = Saga("g8").wait_for("go", timeout=2).step("a", _fwd).seal()
    history = [HistoryRow(AT, "wait-entered"), HistoryRow(AT, "wait-timed-out")]
    (gate, _) = build(definition, _record("failed", cursor=0), [], (), history)
    assert gate.status == "timed out"


def test_a_sub_saga_links_to_its_child_run_and_a_pivot_shows_the_commit() -> None:
    from celery_saga.inspect import MissingChild

    definition = Saga("g5").sub_saga("kid").pivot().step("z", _fwd).seal()
    child = _step("kid", "completed", child=MissingChild("child-run-1"))
    sub, pivot, _ = build(definition, _record(committed_at=AT), [child])
    assert (sub.kind, sub.status, sub.link) == ("sub_saga", "completed", "child-run-1")
    assert (pivot.kind, pivot.status) == ("pivot", "passed")
    assert _flat(build(definition, _record(), []))["pivot"] == ("pivot", NOT_RUN)


def test_a_failed_step_that_was_compensated_shows_its_failure_and_its_reversal() -> None:
    definition = Saga("g6").step("a", _fwd, compensate=_fwd).step("b", _fwd, compensate=_fwd).seal()
    steps = [_step("a", "completed", "compensated"), _step("b", "failed", "compensated", 1)]
    done_then_undone, failed_then_undone = build(definition, _record(), steps)
    assert (done_then_undone.outcome, failed_then_undone.outcome) == ("compensated", "compensated")
    assert (done_then_undone.forward, failed_then_undone.forward) == ("completed", "failed")
    assert failed_then_undone.status == "failed -> compensated"


def test_a_reversal_counts_its_attempts_before_a_resume_too() -> None:
    definition = Saga("g7").step("a", _fwd, compensate=_fwd).step("b", _fwd).seal()
    resumed = _step("a", "completed", "compensated", total_attempts=5)
    (node, _) = build(definition, _record(), [resumed, _step("b", "failed", node=1)])
    assert node.detail == "5 reversal attempts"


def test_a_run_without_its_definition_shows_its_step_records() -> None:
    steps = [_step("a", "completed", "compensated"), replace(_step("b", "failed"), node=1)]
    nodes = build(None, _record(), steps)
    assert flatten(nodes) == [
        ("step a", "completed -> compensated"),
        ("step b", "failed"),
    ]
