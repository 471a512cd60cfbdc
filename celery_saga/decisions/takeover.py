"""May a claim another process holds be taken over? (guarantee 30)

A lease lapses while its holder cannot reach the store (a failover of a minute, a partition
of one worker), so a lapsed lease alone is no proof that the body stopped. Before taking a
claim over, the taker asks the holder's worker, over the broker, whether it still runs that
attempt; the holder renews its lease if it can, or stops the body if it cannot (fencing),
and says which. Only the holder's word, or its silence once its lease has lapsed, frees a
claim.
"""

from __future__ import annotations

from enum import Enum


class Answer(str, Enum):
    """What the holder's worker said of the attempt."""

    #: Still running it, and its lease renewed just now.
    HELD = "held"
    #: It could not renew the lease, so it stopped the body (fencing).
    STOPPED = "stopped"
    #: Its worker runs no such attempt any more (the pool process died, or it finished).
    ABSENT = "absent"
    #: No answer in time: the worker is gone, or cut off from the broker too.
    SILENT = "silent"
    #: Running but not stoppable here (a thread or solo pool) and its lease not renewable.
    UNSTOPPABLE = "unstoppable"
    #: The question could not be sent now (the broker is unreachable from here).
    UNASKED = "unasked"
    #: There is no one to ask: no holder recorded, or no remote control on this transport.
    NO_CHANNEL = "no_channel"


class Takeover(str, Enum):
    #: Claim it: the attempt was lost (counts towards ``retry + 1``, guarantee 27).
    TAKE_OVER = "take_over"
    #: Claim it: its body was stopped by fencing, which is no fault of the step's.
    TAKE_OVER_FENCED = "take_over_fenced"
    #: Leave it to its holder.
    LEAVE = "leave"


def decide_takeover(lease_live: bool, answer: Answer) -> Takeover:
    """Pure: given whether the claim's lease is still live and what its holder answered,
    whether to take the claim over."""
    if answer is Answer.STOPPED:
        return Takeover.TAKE_OVER_FENCED
    if answer is Answer.ABSENT:
        return Takeover.TAKE_OVER
    if lease_live:
        # A live lease is freed only by the holder's own word: a silent holder may be cut
        # off from the broker alone, still renewing.
        return Takeover.LEAVE
    if answer in (Answer.SILENT, Answer.NO_CHANNEL):
        return Takeover.TAKE_OVER
    return Takeover.LEAVE  # HELD, UNSTOPPABLE, UNASKED
