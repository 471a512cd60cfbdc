"""The words every view says of a run's parts, and the one rule for a group's status.

``celery saga show`` (text and ``--json``), the web view and the Django admin print these
words and no others (``tests/test_one_story.py`` renders runs of every shape through all
of them and compares). A step's own status is its record's (``StepStatus``: pending,
running, completed, failed, ...); once its reversal has an outcome it reads
``completed -> compensated``; a wait reads waiting, signalled or timed out; a node no
record reached reads ``not run``."""

from __future__ import annotations

from collections.abc import Iterable

NOT_RUN = "not run"
WAITING = "waiting"
SIGNALLED = "signalled"
TIMED_OUT = "timed out"
#: The pivot once the run committed.
PASSED = "passed"
#: A reversal with attempts and no outcome yet.
REVERSING = "reversing"
#: A group some of whose members ran and some not, none of them needing an eye.
PARTLY_RUN = "partly run"
#: Between a step's own status and its reversal's.
THEN = " -> "

#: What a group shows first, if any member shows it: what needs an operator's eye first.
_URGENT = ("compensation_failed", "failed", "running", REVERSING, "pending", WAITING)
#: Then, with no urgent member, the settled word the most telling member shows.
_SETTLED = (
    "compensation_skipped",
    "compensation_resolved",
    "compensated",
    TIMED_OUT,
    SIGNALLED,
    "completed",
    PASSED,
)


def step_status(status: str, reversal: str | None) -> str:
    """A step's word: its own status, then its reversal's outcome once it has one."""
    return f"{status}{THEN}{reversal}" if reversal else status


def reversal_word(outcome: str | None, attempts: int) -> str | None:
    """A reversal's word: its outcome, ``reversing`` while it has attempts and none."""
    if outcome:
        return outcome
    return REVERSING if attempts else None


def outcome(status: str) -> str:
    """The last word of a status: ``compensated`` for ``completed -> compensated``."""
    return status.rsplit(THEN, 1)[-1]


def group_status(members: Iterable[str]) -> str:
    """A parallel group's, a branch's or a loop's status from its members' (their last
    words): the most urgent any of them shows; else the one word all show; else, when some
    ran and some did not, ``partly run``; else the most telling settled word."""
    shown = [outcome(status) for status in members]
    for word in _URGENT:
        if word in shown:
            return word
    if not shown:
        return NOT_RUN
    if len(set(shown)) == 1:
        return shown[0]
    if NOT_RUN in shown:
        return PARTLY_RUN
    return next((word for word in _SETTLED if word in shown), PARTLY_RUN)


def css_class(status: str) -> str:
    """A status as an HTML class name (``st-`` and its last word, spaces as ``_``)."""
    return "st-" + outcome(status).replace(" ", "_")
