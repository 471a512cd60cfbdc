"""The run page's timeline picture, pure: bars drawn in time order on one axis, a row per
lane with a step's reversals below it, every retry, lost and released attempt a bar of its
own, open bars up to now, waits as spans, a sub-saga's bar a link, every name escaped and
nothing that runs or loads; and the bars the page builds from a run's records and history."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

from celery_saga.inspect import Timeline, TimelineBar, WaitSpan
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


def _timeline(bars: list[TimelineBar], waits: list[WaitSpan] | None = None) -> Timeline:
    return Timeline((), tuple(bars), tuple(waits or ()))


def _bar(
    name: str,
    number: int,
    direction: str,
    start: float,
    end: float | None,
    outcome: str | None,
    **more: Any,
) -> TimelineBar:
    return TimelineBar(
        name, number, direction, at(start), None if end is None else at(end), outcome, **more
    )


def test_the_page_bars_a_run_with_retries_a_lost_attempt_a_wait_and_its_unwind() -> None:
    bars = [
        _bar("charge", 1, "forward", 0, 1, "retrying"),
        _bar("charge", 2, "forward", 1.5, 2, "retrying"),
        _bar("charge", 3, "forward", 2.5, 3, "completed"),
        _bar("pack", 1, "forward", 3, 8, "lost"),
        _bar("pack", 2, "forward", 8, 9, "completed"),
        _bar("ship", 1, "forward", 12, 13, "failed"),
        _bar("pack", 1, "reversal", 13.5, 14, "compensated"),
        _bar("charge", 1, "reversal", 14.5, 15, "compensated"),
    ]
    waits = [WaitSpan("approved", at(9), at(11), "signalled")]
    drawn_bars = bars_of(_timeline(bars, waits), lambda child: f"/runs/{child}")
    told = [(b.kind.value, b.name, b.attempt, b.outcome, b.lane) for b in drawn_bars]
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
    wait = drawn_bars[7]
    assert (wait.start, wait.end) == (at(9), at(11))


def test_an_attempt_and_a_reversal_still_held_are_open_bars() -> None:
    bars = [
        _bar("a", 1, "forward", 0, 1, "retrying"),
        _bar("a", 2, "forward", 1, None, None),
        _bar("b", 1, "forward", 1, 2, "completed"),
        _bar("b", 1, "reversal", 5, None, None),
    ]
    drawn_bars = bars_of(_timeline(bars), str)
    told = [(b.kind.value, b.name, b.attempt, b.outcome, b.start, b.end) for b in drawn_bars]
    assert told == [
        ("attempt", "a", 1, "retrying", at(0), at(1)),
        ("attempt", "a", 2, "running", at(1), None),
        ("attempt", "b", 1, "completed", at(1), at(2)),
        ("reversal", "b", 1, "running", at(5), None),
    ]


def test_a_sub_saga_bar_links_its_child_whose_own_bars_stay_on_its_page() -> None:
    bars = [
        _bar("payment", 1, "forward", 0, None, None, link="run-1/c"),
        _bar("authorize", 1, "forward", 0.5, None, None, depth=1, link="run-1/c"),
    ]
    waits = [WaitSpan("go", at(1), None, None), WaitSpan("child-gate", at(1), None, None, 1)]
    drawn_bars = bars_of(_timeline(bars, waits), lambda c: f"/runs/{c}")
    told = [(b.kind.value, b.name, b.outcome, b.end, b.link, b.lane) for b in drawn_bars]
    assert told == [
        ("attempt", "payment", "running", None, "/runs/run-1/c", 0),
        ("wait", "go", "waiting", None, None, 1),
    ]
    # the read model links a child's own bars; the step's bar takes its child by name
    unlinked = [_bar("payment", 1, "forward", 0, 2, "completed")]
    (bar,) = bars_of(_timeline(unlinked), lambda c: f"/runs/{c}", {"payment": "run-1/c"})
    assert bar.link == "/runs/run-1/c"
    assert [(b.kind.value, b.name, b.outcome, b.end, b.link, b.lane) for b in drawn_bars] == [
        ("attempt", "payment", "running", None, "/runs/run-1/c", 0),
        ("wait", "go", "waiting", None, None, 1),
    ]


def test_a_reversal_outcome_reads_in_the_pictures_words() -> None:
    bars = [
        _bar("a", 1, "forward", 0, 1, "completed"),
        _bar("a", 1, "reversal", 1.5, 2, "lost"),
        _bar("a", 2, "reversal", 2.5, 3, "compensation_failed"),
        _bar("b", 1, "forward", 0, 1, "completed"),
        _bar("b", 1, "reversal", 3, 4, "compensation_skipped"),
    ]
    reversals = [
        (b.name, b.attempt, b.outcome, b.lane)
        for b in bars_of(_timeline(bars), str)
        if b.kind.value == "reversal"
    ]
    assert reversals == [("a", 1, "lost", 1), ("a", 2, "failed", 1), ("b", 1, "skipped", 3)]
