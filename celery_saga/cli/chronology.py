"""A run's timeline for ``celery saga show``: every dated thing that happened to it (step
records, signals, history rows, child runs), in time order, with how long each span took.
Pure functions of the described run (``timeline.describe``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

Entry = dict[str, Any]

#: A history row that ends the span its opening row began: (opening kind, label).
_SPANS = {
    "signalled": ("wait-entered", "waited"),
    "wait-timed-out": ("wait-entered", "waited"),
    "wait-resumed": ("wait-entered", "waited"),
    "resumed": ("parked", "parked"),
    "abandoned": ("parked", "parked"),
}


def span(seconds: float) -> str:
    """A duration as an operator reads it: ms under a second, s under two minutes."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return str(timedelta(seconds=round(seconds)))


def _between(start: str | None, end: str | None) -> float | None:
    if start is None or end is None:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _entry(at: str, kind: str, text: str, **more: Any) -> Entry:
    fields = {"step": None, "took": None, "actor": None, "history_id": None, "depth": 0}
    return {"at": at, "kind": kind, "text": f"{kind:<10} {text}", **fields, **more}


def earlier_reversal_attempts(history: list[dict[str, Any]]) -> dict[str, int]:
    """Step -> reversal attempts a resume reset (kept in its ``resumed`` rows' data), so a
    reversal's attempts count across resumes."""
    earlier: dict[str, int] = {}
    for row in history:
        if row["kind"] == "resumed" and isinstance(row["data"], dict):
            for step, attempts in row["data"].items():
                earlier[step] = earlier.get(step, 0) + int(attempts)
    return earlier


def _attempts(count: int) -> str:
    return f"{count} attempt" + ("" if count == 1 else "s")


def _history_text(run: dict[str, Any], row: dict[str, Any]) -> str:
    kind, detail, data = row["kind"], row["detail"] or "", row["data"]
    if kind == "started":
        return f"saga {run['saga']}"
    if kind == "parked" and row["attempt"]:
        return f"{detail} ({_attempts(row['attempt'])})"
    if kind == "resumed" and row["step"]:
        return f"the unwind; {row['step']} had {_attempts(row['attempt'])} of its reversal"
    if kind == "abandoned" and isinstance(data, dict):
        left = ", ".join(data.get("skipped", ())) or "none"
        return f"the unwind; never reversed: {left}" + (f"; reason: {detail}" if detail else "")
    return detail


#: A step's final attempt rows: its line tells them, naming the worker that settled it.
_STEP_SETTLED = ("step-completed", "step-failed")
#: Attempt rows the step's own lines already tell (the final outcome of it or its reversal).
_TOLD_BY_THE_STEP = (*_STEP_SETTLED, "reversal-completed", "reversal-failed", "reversal-skipped")
#: Attempt rows that end an attempt without ending the step or its reversal: a line each.
_ATTEMPT_ENDS = (
    *("step-retrying", "step-lost", "step-released"),
    *("reversal-retrying", "reversal-lost", "reversal-released"),
)


def _attempt_text(row: dict[str, Any]) -> str:
    where = f" on {row['holder']}" if row["holder"] else ""
    detail = f": {row['detail']}" if row["detail"] else ""
    what = "reversal attempt" if row["kind"].startswith("reversal-") else "attempt"
    return f"{row['step']} {what} {row['attempt']}{where}{detail}"


def _final_holders(run: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(step, attempt) -> the worker, process and task that settled it."""
    return {
        (row["step"], row["attempt"]): row["holder"]
        for row in run["history"]
        if row["kind"] in _STEP_SETTLED and row["holder"]
    }


def _history(run: dict[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    opened: dict[str, str] = {}
    for row in run["history"]:
        if row["kind"] in _TOLD_BY_THE_STEP:
            continue
        if row["kind"] in _ATTEMPT_ENDS:
            seconds = _between(row["started_at"], row["at"])
            took = None if seconds is None else f"took {span(seconds)}"
            text = _attempt_text(row)
            entries.append(
                _entry(
                    row["at"], row["kind"], text, step=row["step"], took=took, history_id=row["id"]
                )
            )
            continue
        took = None
        closes = _SPANS.get(row["kind"])
        if closes is not None and closes[0] in opened:
            seconds = _between(opened.pop(closes[0]), row["at"])
            took = None if seconds is None else f"{closes[1]} {span(seconds)}"
        if row["kind"] in ("wait-entered", "parked"):
            opened[row["kind"]] = row["at"]
        text = _history_text(run, row)
        entries.append(
            _entry(
                row["at"],
                row["kind"],
                text,
                step=row["step"],
                took=took,
                actor=row["actor"],
                history_id=row["id"],
            )
        )
    return entries


def _steps(run: dict[str, Any]) -> list[Entry]:
    entries = []
    holders = _final_holders(run)
    for step in run["steps"]:
        name, within = step["name"], step["within"]
        where = f"  [{within['kind']} {within['name']}]" if within else ""
        key = f"  key={step['idempotency_key']}"
        entries.append(_entry(step["started_at"], "start", f"{name}{where}{key}", step=name))
        if step["completed_at"]:
            error = f"  {step['error']}" if step["status"] == "failed" and step["error"] else ""
            tries = f"  after {step['attempts']} attempts" if step["attempts"] > 1 else ""
            seconds = _between(step["started_at"], step["completed_at"])
            took = None if seconds is None else f"took {span(seconds)}"
            holder = holders.get((name, step["attempts"]))
            on = f"  on {holder}" if holder else ""
            text = f"{name}{tries}{error}{on}"
            entries.append(_entry(step["completed_at"], step["status"], text, step=name, took=took))
        entries.extend(_reversal(step))
        child = step["child"]
        if child and not child.get("missing"):
            entries.extend({**e, "depth": e["depth"] + 1} for e in child["timeline"])
    return entries


def _reversal(step: dict[str, Any]) -> list[Entry]:
    reversal = step["compensation"]
    if not reversal or not reversal["at"] or not reversal["status"]:
        return []
    reason = f"  {reversal['reason']}" if reversal["reason"] else ""
    tries = f"  after {reversal['attempts']} attempts" if reversal["attempts"] > 1 else ""
    total = reversal.get("total_attempts", reversal["attempts"])
    if total != reversal["attempts"]:
        tries = f"  after {total} attempts ({reversal['attempts']} since the last resume)"
    text = f"{step['name']}{tries}{reason}"
    return [_entry(reversal["at"], reversal["status"], text, step=step["name"])]


def events(run: dict[str, Any]) -> list[Entry]:
    """The run's timeline, oldest first, each entry with its offset from the run's start.
    A run stored before its history was written gets its start and signals from its rows."""
    kinds = {row["kind"] for row in run["history"]}
    entries = []
    if "started" not in kinds:
        entries.append(_entry(run["created_at"], "started", f"saga {run['saga']}"))
    if "signalled" not in kinds:
        for signal in run["signals"]:
            text = f"{signal['event']!r} received"
            entries.append(_entry(signal["received_at"], "signal", text))
    entries += _steps(run) + _history(run)
    entries = [e for e in entries if e["at"]]
    entries.sort(key=lambda e: e["at"])  # stable: history rows keep their written order
    start = datetime.fromisoformat(run["created_at"])
    for entry in entries:
        entry["offset_ms"] = (datetime.fromisoformat(entry["at"]) - start).total_seconds() * 1000
    return entries
