"""What a holder's failed renewal or refused outcome means (guarantee 30).

A claim's renewal, and the write of its body's outcome, match the record only while it is
still that attempt's. When one matches nothing, either another attempt took the claim, or
the attempt ended (its outcome was recorded, or the step is no longer owed), or the store
itself lost the claim: a database server crash, or a failover to a replica that never
received it, undoes the last commits, and a claim committed without waiting for its flush
is the likeliest of them. Nobody else claimed it then, so the holder's word is still the
truth: it writes the claim back (``LOST``) instead of leaving the step to be run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ClaimState(str, Enum):
    #: The record is still this attempt's.
    HELD = "held"
    #: The store lost this attempt's claim and nobody claimed the step since: write it back.
    LOST = "lost"
    #: Written back just now (what the holder's side reports after a ``LOST``).
    RESTORED = "restored"
    #: Another attempt, or another holder of this attempt's number, claimed it.
    TAKEN = "taken"
    #: This attempt's outcome is recorded, or the run no longer owes the step.
    ENDED = "ended"


#: The claim is this attempt's (again): its outcome may be written.
MINE = frozenset((ClaimState.HELD, ClaimState.RESTORED))


@dataclass(frozen=True)
class ClaimFound:
    """A step's (or a reversal's) claim columns as read after a write matched nothing."""

    #: The latest attempt the record counts (0: no record at all).
    attempts: int
    holder: str | None
    #: The latest attempt holds it now (running, no outcome yet).
    running: bool
    #: No outcome is recorded yet: the step still awaits an attempt, or runs one.
    open: bool
    #: The run still owes this work: live at the step's position, or unwinding.
    owed: bool


def claim_state(found: ClaimFound, attempt: int, holder: str | None) -> ClaimState:
    """Pure: the state of attempt ``attempt`` (held by ``holder``) given what was read."""
    if found.attempts > attempt:
        return ClaimState.TAKEN
    if found.attempts == attempt:
        if holder is not None and found.holder is not None and found.holder != holder:
            return ClaimState.TAKEN  # after the loss, another process claimed the same number
        return ClaimState.HELD if found.running else ClaimState.ENDED
    # The record is as it was before this attempt's claim: that claim is what was lost.
    if found.attempts == attempt - 1 and found.open and found.owed:
        return ClaimState.LOST
    return ClaimState.ENDED
