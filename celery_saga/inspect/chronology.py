"""A run's timeline as text entries: every dated thing that happened to it (step records,
signals, history rows, child runs), in time order, with how long each span took. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from celery_saga.inspect.values import HistoryRow, RunView, SignalView, StepView, TimelineEntry
from celery_saga.records import ExecutionRecord

#: A history row that ends the span its opening row began: (opening kind, label).
_SPANS = {
    "signalled": ("wait-entered", "waited"),
    "wait-timed-out": ("wait-entered", "waited"),
    "wait-resumed": ("wait-entered", "waited"),
    "resumed": ("parked", "parked"),
    "abandoned": ("parked", "parked"),
    "resolved": ("parked", "parked"),
}
#: A step's final attempt rows: its line tells them, naming the worker that settled it.
_STEP_SETTLED = ("step-completed", "step-failed")
#: Attempt rows the step's own lines already tell (the final outcome of it or its reversal).
_TOLD_BY_THE_STEP = (*_STEP_SETTLED, "reversal-completed", "reversal-failed", "reversal-skipped")
#: Attempt rows that end an attempt without ending the step or its reversal: a line each.
ATTEMPT_ENDS = (
    *("step-retrying", "step-lost", "step-released"),
    *("reversal-retrying", "reversal-lost", "reversal-released"),
)


def span(seconds: float) -> str:
    """A duration as an operator reads it: ms under a second, s under two minutes."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return str(timedelta(seconds=round(seconds)))


def _took(label: str, start: datetime | None, end: datetime | None) -> str | None:
    if start is None or end is None:
        return None
    return f"{label} {span((end - start).total_seconds())}"


def _line(kind: str, text: str) -> str:
    """An entry's text as ``show`` prints it: its kind in a column, then what happened."""
    return f"{kind:<10} {text}"


def earlier_reversal_attempts(history: Sequence[HistoryRow]) -> dict[str, int]:
    """Step -> reversal attempts a resume reset (kept in its ``resumed`` rows' data), so a
    reversal's attempts count across resumes."""
    earlier: dict[str, int] = {}
    for row in history:
        if row.kind == "resumed" and isinstance(row.data, dict):
            for step, attempts in row.data.items():
                earlier[step] = earlier.get(step, 0) + int(attempts)
    return earlier


def _attempts(count: int | None) -> str:
    return f"{count} attempt" + ("" if count == 1 else "s")


def _history_text(record: ExecutionRecord, row: HistoryRow) -> str:
    kind, detail, data = row.kind, row.detail or "", row.data
    if kind == "started":
        return f"saga {record.saga_name}"
    if kind == "parked" and row.attempt:
        return f"{detail} ({_attempts(row.attempt)})"
    if kind == "resumed" and row.step:
        return f"the unwind; {row.step} had {_attempts(row.attempt)} of its reversal"
    if kind == "resolved":
        return f"{row.step}: its reversal done by hand; note: {detail}"
    if kind == "abandoned" and isinstance(data, dict):
        left = ", ".join(data.get("skipped", ())) or "none"
        return f"the unwind; never reversed: {left}" + (f"; reason: {detail}" if detail else "")
    return detail


def _attempt_text(row: HistoryRow) -> str:
    where = f" on {row.holder}" if row.holder else ""
    detail = f": {row.detail}" if row.detail else ""
    what = "reversal attempt" if row.kind.startswith("reversal-") else "attempt"
    return f"{row.step} {what} {row.attempt}{where}{detail}"


def _history(record: ExecutionRecord, history: Sequence[HistoryRow]) -> list[TimelineEntry]:
    entries: list[TimelineEntry] = []
    opened: dict[str, datetime] = {}
    for row in history:
        if row.kind in _TOLD_BY_THE_STEP:
            continue
        if row.kind in ATTEMPT_ENDS:
            took = _took("took", row.started_at, row.at)
            text = _attempt_text(row)
            line = _line(row.kind, text)
            entries.append(
                TimelineEntry(row.at, row.kind, line, step=row.step, took=took, history_id=row.id)
            )
            continue
        took = None
        closes = _SPANS.get(row.kind)
        if closes is not None and closes[0] in opened:
            took = _took(closes[1], opened.pop(closes[0]), row.at)
        if row.kind in ("wait-entered", "parked"):
            opened[row.kind] = row.at
        line = _line(row.kind, _history_text(record, row))
        entries.append(
            TimelineEntry(
                row.at, row.kind, line, step=row.step, took=took, actor=row.actor, history_id=row.id
            )
        )
    return entries


def _step(step: StepView, holders: dict[tuple[str | None, int | None], str]) -> list[TimelineEntry]:
    name, within = step.name, step.within
    entries = []
    if step.started_at is not None:
        where = f"  [{within.kind} {within.name}]" if within else ""
        key = f"  key={step.idempotency_key}"
        line = _line("start", f"{name}{where}{key}")
        entries.append(TimelineEntry(step.started_at, "start", line, step=name))
    if step.completed_at is not None:
        error = f"  {step.error}" if step.status == "failed" and step.error else ""
        tries = f"  after {step.attempts} attempts" if step.attempts > 1 else ""
        took = _took("took", step.started_at, step.completed_at)
        holder = holders.get((name, step.attempts))
        on = f"  on {holder}" if holder else ""
        line = _line(step.status, f"{name}{tries}{error}{on}")
        entries.append(TimelineEntry(step.completed_at, step.status, line, step=name, took=took))
    entries.extend(_reversal(step))
    if isinstance(step.child, RunView):
        entries.extend(replace(e, depth=e.depth + 1) for e in step.child.timeline.entries)
    return entries


def _reversal(step: StepView) -> list[TimelineEntry]:
    reversal = step.compensation
    if reversal is None or reversal.at is None or not reversal.status:
        return []
    reason = f"  {reversal.reason}" if reversal.reason else ""
    tries = f"  after {reversal.attempts} attempts" if reversal.attempts > 1 else ""
    total = reversal.total_attempts
    if total != reversal.attempts:
        tries = f"  after {total} attempts ({reversal.attempts} since the last resume)"
    line = _line(reversal.status, f"{step.name}{tries}{reason}")
    return [TimelineEntry(reversal.at, reversal.status, line, step=step.name)]


def entries(
    record: ExecutionRecord,
    steps: Sequence[StepView],
    signals: Sequence[SignalView],
    history: Sequence[HistoryRow],
) -> tuple[TimelineEntry, ...]:
    """The run's timeline, oldest first, each entry with its offset from the run's start.
    A run stored before its history was written gets its start and signals from its rows."""
    kinds = {row.kind for row in history}
    found = []
    if "started" not in kinds:
        line = _line("started", f"saga {record.saga_name}")
        found.append(TimelineEntry(record.created_at, "started", line))
    if "signalled" not in kinds:
        for signal in signals:
            line = _line("signal", f"{signal.event!r} received")
            found.append(TimelineEntry(signal.received_at, "signal", line))
    holders = {
        (row.step, row.attempt): row.holder
        for row in history
        if row.kind in _STEP_SETTLED and row.holder
    }
    for step in steps:
        found += _step(step, holders)
    found += _history(record, history)
    found.sort(key=lambda e: e.at)  # stable: history rows keep their written order
    start = record.created_at
    return tuple(replace(e, offset_ms=(e.at - start).total_seconds() * 1000) for e in found)
