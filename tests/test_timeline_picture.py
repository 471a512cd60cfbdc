"""The run page's timeline picture, pure: bars drawn in time order on one axis, a row per
lane with a step's reversals below it, every retry, lost and released attempt a bar of its
own, open bars up to now, waits as spans, a sub-saga's bar a link, every name escaped and
nothing that runs or loads; and the bars the page builds from a run's records and history."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
    StepStatus,
)
from celery_saga.store.history import HistoryEntry
from celery_saga.store.inspection import StoredRun
from celery_saga.web.timeline_bars import bars_of
from celery_saga.web.timeline_svg import MAX_LANES, Bar, BarKind, render

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SVG = "{http://www.w3.org/2000/svg}"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(
    name: str, number: int, start: float, end: float | None, outcome: str, lane: int
) -> Bar:
    finish = None if end is None else at(end)
    return Bar(BarKind.ATTEMPT, name, number, at(start), finish, outcome, lane)


def drawn(svg: str) -> list[dict[str, Any]]:
    """Each bar of the picture in document order: its data attributes, rect and tooltip."""
    root = ElementTree.fromstring(svg)
    bars = []
    for group in root.iter(f"{SVG}g"):
        if "bar" not in (group.get("class") or "").split():
            continue
        rect = group.find(f"{SVG}rect")
        assert rect is not None
        data = {k[5:]: v for k, v in group.attrib.items() if k.startswith("data-")}
        data["class"] = group.get("class")
        data["x"], data["y"] = float(rect.get("x", 0)), float(rect.get("y", 0))
        data["width"] = float(rect.get("width", 0))
        data["title"] = group.findtext(f"{SVG}title")
        bars.append(data)
    return bars


def test_bars_come_out_in_time_order_whatever_order_they_are_given_in() -> None:
    bars = [
        attempt("ship", 1, 3, 4, "completed", 2),
        attempt("reserve", 1, 0, 1, "completed", 0),
        attempt("charge", 1, 1, 2, "completed", 1),
    ]
    shown = drawn(render(bars, at(10)))
    assert [b["name"] for b in shown] == ["reserve", "charge", "ship"]
    assert [b["x"] for b in shown] == sorted(b["x"] for b in shown)
    assert shown[0]["start"] == T0.isoformat() and shown[0]["end"] == at(1).isoformat()


def test_each_lane_is_a_row_of_its_own_in_lane_order() -> None:
    bars = [
        attempt("reserve", 1, 0, 1, "completed", 0),
        Bar(BarKind.REVERSAL, "reserve", 1, at(5), at(6), "completed", 1),
        attempt("charge", 1, 1, 2, "failed", 2),
    ]
    shown = {(b["kind"], b["name"]): b for b in drawn(render(bars, at(10)))}
    rows = [shown[key]["y"] for key in (("attempt", "reserve"), ("reversal", "reserve"))]
    assert rows[0] < rows[1] < shown[("attempt", "charge")]["y"]
    root = ElementTree.fromstring(render(bars, at(10)))
    labels = [g.findtext(f"{SVG}text") for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]
    assert labels == ["reserve", "↶ undo reserve", "charge"]


def test_each_retry_is_a_bar_with_its_attempt_number_and_how_it_ended() -> None:
    bars = [
        attempt("charge", 1, 0, 1, "retrying", 0),
        attempt("charge", 2, 1.5, 2, "retrying", 0),
        attempt("charge", 3, 2.5, 3, "retrying", 0),
        attempt("charge", 4, 3.5, 4, "completed", 0),
    ]
    shown = drawn(render(bars, at(4)))
    assert [(b["attempt"], b["outcome"]) for b in shown] == [
        ("1", "retrying"),
        ("2", "retrying"),
        ("3", "retrying"),
        ("4", "completed"),
    ]
    assert len({b["y"] for b in shown}) == 1, "one step, one lane"
    assert all(b["x"] + b["width"] <= after["x"] + 0.01 for b, after in pairwise(shown))
    assert "out-retrying" in shown[0]["class"] and "charge attempt 1: retrying" in shown[0]["title"]


def test_a_lost_and_a_released_attempt_are_bars_drawn_apart_from_the_others() -> None:
    bars = [
        attempt("pack", 1, 0, 3, "lost", 0),
        attempt("pack", 2, 3, 4, "released", 0),
        attempt("pack", 3, 4, 5, "completed", 0),
    ]
    svg = render(bars, at(5))
    classes = [b["class"] for b in drawn(svg)]
    assert classes == [
        "bar kind-attempt out-lost",
        "bar kind-attempt out-released",
        "bar kind-attempt out-completed",
    ]
    assert ".tl .out-lost rect" in svg and ".tl .out-released rect" in svg
    legend = ElementTree.fromstring(svg).find(f"{SVG}g[@class='legend']")
    assert legend is not None
    words = [t.text for t in legend.iter(f"{SVG}text")]
    assert words == ["attempt lost", "attempt released", "attempt completed"]


def test_an_open_bar_reaches_now_and_says_it_is_still_open() -> None:
    bars = [attempt("a", 1, 0, 1, "completed", 0), attempt("b", 1, 1, None, "running", 1)]
    first, held = drawn(render(bars, at(4)))
    assert held["end"] == "" and "open" in held["class"].split()
    assert held["width"] > 2 * first["width"], "drawn up to now: three seconds, not one"
    assert "still open" in held["title"]


def test_a_wait_is_a_span_in_its_own_lane_with_its_outcome() -> None:
    bars = [
        attempt("a", 1, 0, 1, "completed", 0),
        Bar(BarKind.WAIT, "approved", None, at(1), at(3), "signalled", 1),
        Bar(BarKind.WAIT, "packed", None, at(3), at(5), "timed out", 2),
    ]
    _, signalled, timed_out = drawn(render(bars, at(5)))
    assert signalled["kind"] == "wait" and signalled["attempt"] == ""
    assert signalled["title"] == "wait for 'approved': signalled, 2 s"
    assert "out-timed-out" in timed_out["class"]


def test_a_sub_saga_bar_links_to_its_child_run() -> None:
    child = Bar(BarKind.ATTEMPT, "child", 1, at(0), at(2), "completed", 0, "/runs/child-1")
    root = ElementTree.fromstring(render([child], at(2)))
    links = list(root.iter(f"{SVG}a"))
    assert [a.get("href") for a in links] == ["/runs/child-1"]
    assert links[0].find(f"{SVG}g") is not None


def test_every_name_is_escaped_and_nothing_runs_or_loads() -> None:
    hostile = '<script>alert(1)</script>" onmouseover="alert(2)'
    bars = [
        attempt(hostile, 1, 0, 1, "completed", 0),
        Bar(BarKind.WAIT, hostile, None, at(1), at(2), "signalled", 1),
        Bar(BarKind.ATTEMPT, "c", 1, at(2), at(3), "completed", 2, 'javascript:x" onclick="y'),
    ]
    svg = render(bars, at(3))
    assert "<script" not in svg and 'onmouseover="' not in svg and 'onclick="' not in svg
    root = ElementTree.fromstring(svg)  # well-formed: the names did not break out
    names = [b["name"] for b in drawn(svg)]
    assert names == [hostile, hostile, "c"]
    assert not [e for e in root.iter() if any(k.startswith("on") for k in e.attrib)]
    assert "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_axis_starts_at_the_origin_given_so_its_offsets_are_the_text_timelines() -> None:
    bars = [attempt("a", 1, 2, 4, "completed", 0)]
    from_first = drawn(render(bars, at(4)))[0]
    from_start = drawn(render(bars, at(4), origin=T0))[0]
    assert from_first["x"] < from_start["x"], "half the axis is the time before the bar"
    root = ElementTree.fromstring(render(bars, at(4), origin=T0))
    axis = root.find(f"{SVG}g[@class='axis']")
    assert axis is not None
    ticks = [t.text for t in axis.iter(f"{SVG}text")]
    assert ticks[:3] == ["0", "+500 ms", "+1 s"] and ticks[-1] == "+4 s"
    last = list(axis.iter(f"{SVG}text"))[-1]
    assert last.get("text-anchor") == "end", "the right edge's label ends at its line"


def test_no_bars_draw_nothing() -> None:
    assert render([], T0) == ""


def test_lanes_past_the_most_drawn_are_counted_not_drawn() -> None:
    bars = [attempt(f"s{n}", 1, n, n + 1, "completed", n) for n in range(MAX_LANES + 5)]
    svg = render(bars, at(MAX_LANES + 5))
    assert len(drawn(svg)) == MAX_LANES
    assert "5 more lanes are not drawn" in svg


# The bars the run page builds from what it reads.


def _step(name: str, **fields: Any) -> StepRecord:
    base: dict[str, Any] = {
        "id": 1,
        "execution_id": "run-1",
        "name": name,
        "node": 0,
        "sub": 0,
        "status": StepStatus.COMPLETED,
        "attempts": 1,
        "idempotency_key": f"run-1:{name}",
        "compensatable": True,
    }
    return StepRecord(**{**base, **fields})


def _run(steps: list[StepRecord], rows: list[HistoryEntry], state: ExecutionState) -> StoredRun:
    record = ExecutionRecord(
        "run-1", "shop", "h", state, 0, 0, {}, None, None, None, None, None, 1, T0, at(60)
    )
    return StoredRun(record, tuple(steps), (), None, tuple(rows))


def _row(kind: str, step: str | None, number: int | None, end: float, start: float | None) -> Any:
    began = None if start is None else at(start)
    return HistoryEntry(at(end), kind, step=step, attempt=number, started_at=began)


def test_the_page_bars_a_run_with_retries_a_lost_attempt_a_wait_and_its_unwind() -> None:
    steps = [
        _step("charge", attempts=3, started_at=at(0), completed_at=at(3), compensated_at=at(15)),
        _step("pack", attempts=2, started_at=at(3), completed_at=at(9), compensated_at=at(14)),
        _step("ship", status=StepStatus.FAILED, started_at=at(12), completed_at=at(13)),
    ]
    rows = [
        _row("step-retrying", "charge", 1, 1, 0),
        _row("step-retrying", "charge", 2, 2, 1.5),
        _row("step-completed", "charge", 3, 3, 2.5),
        _row("step-lost", "pack", 1, 8, None),  # written by the takeover: no start
        _row("step-completed", "pack", 2, 9, 8),
        HistoryEntry(at(9), "wait-entered", data={"event": "approved"}),
        HistoryEntry(at(11), "signalled", data={"event": "approved"}),
        _row("step-failed", "ship", 1, 13, 12),
        _row("reversal-completed", "pack", 1, 14, 13.5),
        _row("reversal-completed", "charge", 1, 15, 14.5),
    ]
    bars = bars_of(_run(steps, rows, ExecutionState.FAILED), lambda child: f"/runs/{child}")
    told = [(b.kind.value, b.name, b.attempt, b.outcome, b.lane) for b in bars]
    assert told == [
        ("attempt", "charge", 1, "retrying", 0),
        ("attempt", "charge", 2, "retrying", 0),
        ("attempt", "charge", 3, "completed", 0),
        ("reversal", "charge", 1, "completed", 1),
        ("attempt", "pack", 1, "lost", 2),
        ("attempt", "pack", 2, "completed", 2),
        ("reversal", "pack", 1, "completed", 3),
        ("wait", "approved", None, "signalled", 4),
        ("attempt", "ship", 1, "failed", 5),
    ]
    lost = bars[4]
    assert (lost.start, lost.end) == (at(3), at(8)), "from the step's start to its takeover"
    wait = bars[7]
    assert (wait.start, wait.end) == (at(9), at(11))


def test_an_attempt_and_a_reversal_still_held_are_open_bars() -> None:
    running = _step("a", status=StepStatus.RUNNING, attempts=2, started_at=at(0))
    reversing = _step(
        "b",
        started_at=at(1),
        completed_at=at(2),
        compensation_attempts=1,
        compensation_lease_expires_at=at(30),
    )
    rows = [_row("step-retrying", "a", 1, 1, 0), _row("step-completed", "b", 1, 2, 1)]
    rows.append(HistoryEntry(at(5), "unwind-begun"))
    bars = bars_of(_run([running, reversing], rows, ExecutionState.COMPENSATING), str)
    told = [(b.kind.value, b.name, b.attempt, b.outcome, b.start, b.end) for b in bars]
    assert told == [
        ("attempt", "a", 1, "retrying", at(0), at(1)),
        ("attempt", "a", 2, "running", at(1), None),
        ("attempt", "b", 1, "completed", at(1), at(2)),
        ("reversal", "b", 1, "running", at(5), None),
    ]


def test_a_sub_saga_record_is_one_bar_linking_its_child_and_a_waiting_gate_is_open() -> None:
    child = _step(
        "payment", status=StepStatus.RUNNING, started_at=at(0), child_execution_id="run-1/c"
    )
    rows = [HistoryEntry(at(1), "wait-entered", data={"event": "go"})]
    bars = bars_of(_run([child], rows, ExecutionState.WAITING), lambda c: f"/runs/{c}")
    told = [(b.kind.value, b.name, b.outcome, b.end, b.link, b.lane) for b in bars]
    assert told == [
        ("attempt", "payment", "running", None, "/runs/run-1/c", 0),
        ("wait", "go", "waiting", None, None, 1),
    ]


def test_a_gate_left_by_a_cancel_ends_at_the_cancel() -> None:
    rows = [
        HistoryEntry(at(1), "wait-entered", data={"event": "go"}),
        HistoryEntry(at(4), "cancelled"),
    ]
    (bar,) = bars_of(_run([], rows, ExecutionState.CANCELLED), str)
    assert (bar.end, bar.outcome) == (at(4), "cancelled")


def test_a_reversal_outcome_reads_as_the_history_says_it() -> None:
    step = _step(
        "a",
        started_at=at(0),
        completed_at=at(1),
        compensation_status=CompensationOutcome.FAILED,
        compensated_at=at(3),
    )
    rows = [
        _row("step-completed", "a", 1, 1, 0),
        HistoryEntry(at(1.5), "unwind-begun"),
        _row("reversal-lost", "a", 1, 2, None),
        _row("reversal-failed", "a", 2, 3, 2.5),
    ]
    bars = bars_of(_run([step], rows, ExecutionState.COMPENSATION_STUCK), str)
    reversals = [
        (b.attempt, b.outcome, b.start, b.lane) for b in bars if b.kind.value == "reversal"
    ]
    # the lost one, undated, from the row before it (not from the step's end) to its takeover
    assert reversals == [(1, "lost", at(1.5), 1), (2, "failed", at(2.5), 1)]
