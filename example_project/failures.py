"""The demo's failures on purpose, and how they are shown: one line under their timeline.

The engine logs every failed attempt (Celery adds the traceback), as a worker should. In the demo
those failures are the point, so a filter takes the records of ``IntentionalFailure``s off
the log: an attempt that will be retried becomes a ``retry`` line of its timeline, and a
final one is already the timeline's ``failed`` or ``compensation_failed`` line. Any other
error still reaches the log with its traceback. The engine's own WARNING lines about a
park caused by such a failure, and about the resume that follows, are shown by the
timelines (the run's state and reason) and left off the log too, as are its lines about a
run held by such a failure and the operator's retry of it (timeline 6), as are Celery's own
lines for the step tasks that raised them (each step is its own Celery task, so Celery logs
its failure as it would for a plain call).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from datetime import datetime, timezone

#: What the engine says when an intentional failure parks a run, and when the operator's
#: resume re-runs its reversal: the timelines show both (``state=compensation_stuck``, 3b).
_DECISION = re.compile(
    r"^(execution \S+ of saga '[^']*' parked compensation_stuck .*"
    r"(WarehouseUnreachable|ShippingRefused)|resume_compensation \S+: the reversal of step "
    r"|saga '[^']*' execution \S+: (step '[^']+' failed for good .* is held for an operator"
    r".*CourierUnreachable|held step '[^']+' retried by ))",
    re.DOTALL,
)
_ATTEMPT = re.compile(
    r"^saga '[^']*' execution (?P<execution>\S+): (?P<reversal>reversal of )?"
    r"step '(?P<step>[^']+)' attempt (?P<attempt>\d+) failed: (?P<reason>.*)$",
    re.DOTALL,
)


_INTENTIONAL = re.compile(r"^(WarehouseUnreachable|ShippingRefused|CourierUnreachable): ")


class IntentionalFailure(Exception):
    """Raised by the demo's tasks on purpose (a carrier refusing, a warehouse down)."""


class ShippingRefused(IntentionalFailure, RuntimeError):
    pass


class WarehouseUnreachable(IntentionalFailure, ConnectionError):
    pass


class CourierUnreachable(IntentionalFailure, ConnectionError):
    pass


class FailureLog(logging.Filter):
    """Takes the engine's records of intentional failures off the log, keeping the retried
    ones per execution as ``(time, line)``; lets every other record through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, list[tuple[datetime, str]]] = defaultdict(list)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if _DECISION.match(record.getMessage()):
            return False
        if record.name == "celery.app.trace" and isinstance(error, IntentionalFailure):
            return False  # the step task's own "raised unexpected" line, as for a plain call
        found = _ATTEMPT.match(record.getMessage())
        # The engine's line carries no traceback when Celery logs the task's own: the reason
        # names the error's class.
        if found is None or not (
            isinstance(error, IntentionalFailure) or _INTENTIONAL.match(found["reason"])
        ):
            return True
        if record.levelno < logging.ERROR:  # ERROR: the last attempt, shown by its outcome
            what = found["step"] + (" compensation" if found["reversal"] else "")
            line = f"retry      {what}  (attempt {found['attempt']}: {found['reason']})"
            moment = datetime.fromtimestamp(record.created, timezone.utc)
            self.lines[found["execution"]].append((moment, line))
        return False
