"""The run page's timeline bars (``timeline_svg.Bar``) from the run as the page reads it: its
step records and its history's attempt, reversal and wait rows.

Each attempt's history row gives its end and (since attempts were dated) its start. A row
without a start (a ``lost`` one, written by the worker that took the claim over) starts
where the previous attempt of its step and direction ended, else (the first) at the
step's start, or for a reversal at the history row written before it. An attempt still
held (its record running, no row for it yet) is an open bar from there; a reversal still
held starts at the run's last history row (a reversal's claim writes no row). A step
without attempt rows (its first attempt running, a run stored before attempts had rows) is
one bar from its record; a sub-saga's bars open its child run. Lanes: each step and each
wait gets one in the order they began, and a step's reversals the lane below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from celery_saga.records import ExecutionState, StepRecord, StepStatus
from celery_saga.store.history import ATTEMPT_KINDS, REVERSAL_KINDS, HistoryEntry, Kind
from celery_saga.store.inspection import StoredRun
from celery_saga.web.timeline_svg import Bar, BarKind

#: The rows that end a wait, and the outcome each gives it.
_WAIT_ENDS = {
    Kind.SIGNALLED.value: "signalled",
    Kind.WAIT_RESUMED.value: "signalled",
    Kind.WAIT_TIMED_OUT.value: "timed out",
}


_ATTEMPT_ROWS = ATTEMPT_KINDS | REVERSAL_KINDS
#: An attempt's history row, with the time of the row written before it (a start for one
#: that has none and follows no attempt of its own: a reversal's first, lost).
_Row = tuple[HistoryEntry, datetime | None]


def bars_of(run: StoredRun, link: Callable[[str], str]) -> tuple[Bar, ...]:
    """``run``'s bars, lanes set; ``link``: a child run's id to its page's URL."""
    rows: dict[tuple[str, BarKind], list[_Row]] = {}
    previous: datetime | None = None
    for row in run.history:
        if row.step is not None and row.kind in _ATTEMPT_ROWS:
            kind = BarKind.REVERSAL if row.kind in REVERSAL_KINDS else BarKind.ATTEMPT
            rows.setdefault((row.step, kind), []).append((row, previous))
        previous = row.at
    tracks: list[list[Bar]] = []
    for record in run.steps:
        forward = _forward(record, rows.get((record.name, BarKind.ATTEMPT), []), link)
        back = _reversals(record, rows.get((record.name, BarKind.REVERSAL), []), previous)
        tracks += [track for track in (forward, back) if track]
    tracks += [[bar] for bar in _waits(run)]
    return _laned(tracks)


def _laned(tracks: list[list[Bar]]) -> tuple[Bar, ...]:
    """A lane for each track in the order its first bar began, a step's reversals (the track
    after its own) right below it."""
    pairs: list[list[list[Bar]]] = []
    for track in tracks:
        if track[0].kind is BarKind.REVERSAL and pairs and pairs[-1][0][0].name == track[0].name:
            pairs[-1].append(track)
        else:
            pairs.append([track])
    pairs.sort(key=lambda pair: pair[0][0].start)
    laned = [
        replace(bar, lane=lane)
        for lane, track in enumerate(track for pair in pairs for track in pair)
        for bar in track
    ]
    return tuple(laned)


def _dated(kind: BarKind, name: str, rows: list[_Row], first: datetime | None) -> list[Bar]:
    """A bar per attempt row. One without a start begins where the previous attempt ended,
    the first at ``first`` (else at the row written before it)."""
    bars: list[Bar] = []
    for row, before in rows:
        since = bars[-1].end if bars else first or before
        start = row.started_at or since or row.at
        outcome = row.kind.split("-", 1)[1]  # step-retrying: retrying
        bars.append(Bar(kind, name, row.attempt, start, row.at, outcome, 0))
    return bars


def _forward(record: StepRecord, rows: list[_Row], link: Callable[[str], str]) -> list[Bar]:
    """The step's attempts; each opens the child run when the step is a sub-saga (whose
    record settles with a row, as an attempt does)."""
    if record.started_at is None:
        return []
    child = None if record.child_execution_id is None else link(record.child_execution_id)
    name, held = record.name, record.status is StepStatus.RUNNING
    if not rows:  # its first attempt, a sub-saga's record, a run stored before attempt rows
        end = record.completed_at
        outcome = "running" if held or end is None else record.status.value
        bars = [Bar(BarKind.ATTEMPT, name, record.attempts, record.started_at, end, outcome, 0)]
    else:
        bars = _dated(BarKind.ATTEMPT, name, rows, record.started_at)
        if held and rows[-1][0].attempt != record.attempts:
            start = bars[-1].end or record.started_at
            bars.append(Bar(BarKind.ATTEMPT, name, record.attempts, start, None, "running", 0))
    return bars if child is None else [replace(bar, link=child) for bar in bars]


def _reversals(record: StepRecord, rows: list[_Row], last_row: datetime | None) -> list[Bar]:
    bars = _dated(BarKind.REVERSAL, record.name, rows, None)
    held = record.compensation_lease_expires_at is not None and record.compensation_status is None
    if held and (not rows or rows[-1][0].attempt != record.compensation_attempts):
        start = bars[-1].end if bars else last_row or record.completed_at
        if start is not None:
            number = record.compensation_attempts
            bars.append(Bar(BarKind.REVERSAL, record.name, number, start, None, "running", 0))
    return bars


def _waits(run: StoredRun) -> list[Bar]:
    """A bar per gate entered: from its ``wait-entered`` row to the row that ended it (a
    signal, its timeout, a cancel); open while the run still waits there."""
    bars: list[Bar] = []
    entered: HistoryEntry | None = None
    for row in run.history:
        if row.kind == Kind.WAIT_ENTERED.value:
            entered = row
        elif entered is not None and row.kind in (*_WAIT_ENDS, Kind.CANCELLED.value):
            bars.append(_wait(entered, row.at, _WAIT_ENDS.get(row.kind, row.kind)))
            entered = None
    if entered is not None:
        record = run.record
        if record.state is ExecutionState.WAITING:
            bars.append(_wait(entered, None, "waiting"))
        else:  # left by a way no row tells (a row of an older version): as far as known
            bars.append(_wait(entered, record.updated_at, record.state.value))
    return bars


def _wait(entered: HistoryEntry, end: datetime | None, outcome: str) -> Bar:
    data = entered.data if isinstance(entered.data, dict) else {}
    event = str(data.get("event", "")) or "a signal"
    return Bar(BarKind.WAIT, event, None, entered.at, end, outcome, 0)
