"""A run's timeline as a picture's parts (pure): one bar per attempt of a step or of its
reversal, in time order, with its start, end and outcome, a lost attempt starting where
the one before it ended, the attempt still running, and each wait as a span."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery_saga.inspect import HistoryRow, ReversalView, StepView, TimelineBar, WaitSpan
from celery_saga.inspect.bars import timeline_bars

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _step(name: str, holder: str | None = None, reversal: ReversalView | None = None) -> StepView:
    return StepView(
        name, name, None, 0, None, "running" if holder else "completed", 1, f"k-{name}",
        _at(0), None, None, None, holder, True, reversal, None,
    )  # fmt: skip


def _row(
    kind: str, step: str | None, attempt: int | None, start: float | None, end: float
) -> HistoryRow:
    began = None if start is None else _at(start)
    return HistoryRow(_at(end), kind, step=step, attempt=attempt, started_at=began)


def test_each_attempt_and_each_reversal_is_a_bar_in_time_order() -> None:
    history = [
        _row("step-retrying", "charge", 1, 1, 2),
        _row("step-retrying", "charge", 2, 3, 4),
        _row("step-lost", "charge", 3, None, 9),  # the taker-over knows no start
        _row("step-failed", "charge", 4, 10, 11),
        HistoryRow(_at(0.5), "wait-entered", data={"event": "approved"}),
        HistoryRow(_at(0.9), "wait-timed-out"),
        _row("reversal-completed", "reserve", 1, 12, 13),
    ]
    bars, waits = timeline_bars([_step("reserve"), _step("charge")], history)
    assert [(b.name, b.attempt, b.direction, b.outcome) for b in bars] == [
        ("charge", 1, "forward", "retrying"),
        ("charge", 2, "forward", "retrying"),
        ("charge", 3, "forward", "lost"),
        ("charge", 4, "forward", "failed"),
        ("reserve", 1, "reversal", "compensated"),
    ]
    assert (bars[2].start, bars[2].end) == (_at(4), _at(9)), "from the attempt before it"
    assert waits == (WaitSpan("approved", _at(0.5), _at(0.9), "timed out"),)


def test_an_attempt_under_way_is_a_bar_without_an_end() -> None:
    history = [_row("step-retrying", "slow", 1, 1, 2)]
    bars, waits = timeline_bars([_step("slow", holder="w/1/t")], history)
    assert bars[-1] == TimelineBar("slow", 1, "forward", _at(2), None, None)
    assert waits == ()
