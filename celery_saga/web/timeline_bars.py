"""The run page's timeline bars (``timeline_svg.Bar``) from the read model's timeline
(``RunView.timeline``: a bar per attempt of a step or of its reversal, a span per wait).

Only the run's own bars are drawn (a child run's are on its own page, which its sub-saga
step's bars open). Lanes: each step and each wait gets one in the order it began, and a
step's reversals the lane right below it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from celery_saga.inspect import Timeline
from celery_saga.web.timeline_svg import Bar, BarKind

#: A reversal's outcome in the read model's words -> the picture's (its kind tells it is
#: a reversal).
_REVERSAL_OUTCOMES = {
    "compensated": "completed",
    "compensation_failed": "failed",
    "compensation_skipped": "skipped",
}


def bars_of(
    timeline: Timeline, link: Callable[[str], str], children: Mapping[str, str] | None = None
) -> tuple[Bar, ...]:
    """``timeline``'s bars, lanes set; ``link``: a child run's id to its page's URL;
    ``children``: the child run each sub-saga step started, by step name."""
    children = children or {}
    tracks: dict[tuple[str, BarKind], list[Bar]] = {}
    for bar in timeline.bars:
        if bar.depth:
            continue
        kind = BarKind.REVERSAL if bar.direction == "reversal" else BarKind.ATTEMPT
        outcome = bar.outcome or "running"
        if kind is BarKind.REVERSAL:
            outcome = _REVERSAL_OUTCOMES.get(outcome, outcome)
        child = bar.link or children.get(bar.name)
        url = None if child is None else link(child)
        drawn = Bar(kind, bar.name, bar.attempt, bar.start, bar.end, outcome, 0, url)
        tracks.setdefault((bar.name, kind), []).append(drawn)
    ordered: list[list[Bar]] = []
    for (name, kind), track in tracks.items():
        if kind is BarKind.ATTEMPT:
            ordered.append(track)
            back = tracks.get((name, BarKind.REVERSAL))
            if back:
                ordered.append(back)
        elif (name, BarKind.ATTEMPT) not in tracks:
            ordered.append(track)
    for wait in timeline.waits:
        if not wait.depth:
            outcome = wait.outcome or "waiting"
            ordered.append(
                [
                    Bar(
                        BarKind.WAIT,
                        wait.event or "a signal",
                        None,
                        wait.start,
                        wait.end,
                        outcome,
                        0,
                    )
                ]
            )
    return _laned(ordered)


def _laned(tracks: list[list[Bar]]) -> tuple[Bar, ...]:
    """A lane for each track in the order its first bar began, a step's reversals (the track
    after its own) right below it."""
    pairs: list[list[list[Bar]]] = []
    for track in tracks:
        if track[0].kind is BarKind.REVERSAL and pairs and pairs[-1][0][0].name == track[0].name:
            pairs[-1].append(track)
        else:
            pairs.append([track])
    pairs.sort(key=lambda pair: min(bar.start for bar in pair[0]))
    laned = [
        replace(bar, lane=lane)
        for lane, track in enumerate(track for pair in pairs for track in pair)
        for bar in track
    ]
    return tuple(laned)
