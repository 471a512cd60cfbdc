"""What handling one node or reversal message did, returned as a value.

``Executor.run_node`` and ``Unwinder.run`` return one of these once everything the message
did is recorded; the worker turns it into the way the Celery task ends (SUCCESS, FAILURE,
RETRY, ignored) in one mapping, ``worker/endings.py``. A new ending is a new kind here and
a new case there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ran:
    """A body ran and its success is recorded; ``result`` is what was stored, with the
    parts its saga marks sensitive redacted (it is what Celery logs, sends and keeps)."""

    result: Any = None


@dataclass(frozen=True)
class Retrying:
    """The attempt failed and another is scheduled ``countdown`` seconds from now.
    ``body_error`` is what the message's own task body raised, if the failure came from it."""

    description: str
    countdown: float
    body_error: BaseException | None = None


@dataclass(frozen=True)
class Failed:
    """The attempt failed for good and its failure is recorded (the run may unwind), or,
    in a run being cancelled, left for the cancel's unwind to record."""

    description: str
    body_error: BaseException | None = None


@dataclass(frozen=True)
class TakenOver:
    """A body ran, but its claim was no longer this worker's when its outcome was written:
    nothing of it was recorded."""

    description: str
    result: Any = None


@dataclass(frozen=True)
class NoBody:
    """The message ran no body: it moved the run (a gate, a sub-saga, a loop's end, a
    failure no step raised) or nothing was due (a duplicate, a stale or held message)."""

    reason: str


@dataclass(frozen=True)
class Stopped:
    """The run's cancel stopped the body: its task was revoked (``SoftTimeLimitExceeded``
    in the body) and its worker announced it REVOKED (``runtime/revocation.py``), nothing of
    the attempt is recorded, and the cancel's unwind records the step. The task ends as that
    revoke left it: REVOKED, not as a success or a failure."""

    description: str


@dataclass(frozen=True)
class Interrupted:
    """The worker's own shutdown cut the body short: nothing is recorded, the claim is given
    up, and the task ends with ``error`` so the pool accounts for the job as lost."""

    description: str
    error: BaseException


Outcome = Ran | Retrying | Failed | TakenOver | NoBody | Stopped | Interrupted


def attempt_failed(what: str, saga_name: str, step: str, attempt: int, reason: str) -> str:
    """The sentence a failed attempt is reported with (``what``: "step" or "reversal of
    step")."""
    return f"{what} {step!r} of saga {saga_name!r} attempt {attempt} failed: {reason}"


def no_body_if_taken_over(outcome: Outcome) -> Outcome:
    """An attempt that failed before its body ran, whose claim was then found taken over,
    ran nothing here: its task ends as a message that ran no body."""
    return NoBody(outcome.description) if isinstance(outcome, TakenOver) else outcome
