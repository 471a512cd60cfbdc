"""A run's timeline as a picture's parts: one bar per attempt of a step or of its reversal
(from the history's attempt rows, each with its start and end), the attempts still
running, and each wait at a gate as a span. A renderer draws them on a time axis. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from celery_saga.inspect import vocabulary as words
from celery_saga.inspect.values import HistoryRow, RunView, StepView, TimelineBar, WaitSpan

FORWARD, REVERSAL = "forward", "reversal"
#: An attempt row's kind -> (direction, how the attempt ended).
_ENDED = {
    "step-completed": (FORWARD, "completed"),
    "step-failed": (FORWARD, "failed"),
    "step-retrying": (FORWARD, "retrying"),
    "step-lost": (FORWARD, "lost"),
    "step-released": (FORWARD, "released"),
    "reversal-completed": (REVERSAL, "compensated"),
    "reversal-failed": (REVERSAL, "compensation_failed"),
    "reversal-skipped": (REVERSAL, "compensation_skipped"),
    "reversal-retrying": (REVERSAL, "retrying"),
    "reversal-lost": (REVERSAL, "lost"),
    "reversal-released": (REVERSAL, "released"),
}
#: A history row that ends a wait, and the wait's outcome.
_WAIT_ENDS = {"signalled": words.SIGNALLED, "wait-timed-out": words.TIMED_OUT, "wait-resumed": None}


def _ended(steps: Sequence[StepView], history: Sequence[HistoryRow]) -> list[TimelineBar]:
    """The attempts that ended. A row without its attempt's start (a lost attempt's,
    written by whoever took it over) starts where the one before it ended, or the step."""
    first = {step.name: step.started_at for step in steps}
    last_end: dict[tuple[str, str], datetime] = {}
    bars = []
    for row in history:
        found = _ENDED.get(row.kind)
        if found is None or row.step is None:
            continue
        direction, outcome = found
        start = row.started_at or last_end.get((row.step, direction)) or first.get(row.step)
        last_end[(row.step, direction)] = row.at
        bar = TimelineBar(row.step, row.attempt or 0, direction, start or row.at, row.at, outcome)
        bars.append(bar)
    return bars


def _running(steps: Sequence[StepView], ended: Sequence[TimelineBar]) -> list[TimelineBar]:
    """The attempts under way: a step or a reversal whose claim a worker holds now, from
    the end of its last ended attempt (or the step's start)."""
    bars = []
    for step in steps:
        claims = [(FORWARD, step.holder, step.attempts)]
        if step.compensation is not None:
            claims.append((REVERSAL, step.compensation.holder, step.compensation.attempts))
        for direction, holder, attempt in claims:
            if holder is None:
                continue
            before = [b.end for b in ended if b.name == step.name and b.direction == direction]
            start = max((at for at in before if at is not None), default=step.started_at)
            if start is not None:
                bars.append(TimelineBar(step.name, attempt, direction, start, None, None))
    return bars


def _waits(history: Sequence[HistoryRow]) -> list[WaitSpan]:
    spans: list[WaitSpan] = []
    entered: HistoryRow | None = None
    for row in history:
        if row.kind == "wait-entered":
            entered = row
        elif row.kind in _WAIT_ENDS and entered is not None:
            spans.append(WaitSpan(_event(entered), entered.at, row.at, _WAIT_ENDS[row.kind]))
            entered = None
    if entered is not None:
        spans.append(WaitSpan(_event(entered), entered.at, None, None))
    return spans


def _event(row: HistoryRow) -> str:
    data = row.data
    return str(data.get("event", "")) if isinstance(data, dict) else ""


def timeline_bars(
    steps: Sequence[StepView], history: Sequence[HistoryRow]
) -> tuple[tuple[TimelineBar, ...], tuple[WaitSpan, ...]]:
    """Every attempt's bar in start order (the unwind's reversals after the forward
    attempts they undo, child runs' bars one level down and linked), and the waits."""
    ended = _ended(steps, history)
    bars = ended + _running(steps, ended)
    waits = _waits(history)
    for step in steps:
        if isinstance(step.child, RunView):
            child = step.child
            bars += [
                replace(b, depth=b.depth + 1, link=b.link or child.id) for b in child.timeline.bars
            ]
            waits += [replace(w, depth=w.depth + 1) for w in child.timeline.waits]
    bars.sort(key=lambda b: (b.start, b.direction == REVERSAL))
    waits.sort(key=lambda w: w.start)
    return tuple(bars), tuple(waits)
