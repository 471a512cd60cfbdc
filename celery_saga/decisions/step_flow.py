"""Step flow control (guarantee 37): at a limited step's door, may this attempt start, and
which waiting steps does a slot that frees start? And a rate's next turn.

The store reads these under the lock of the key's row, so two doors of one key decide one
after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TypeVar

Waiter = TypeVar("Waiter")


def grant(free: int, ahead: Sequence[Waiter]) -> tuple[bool, list[Waiter]]:
    """``free`` slots of a key, and the live waiters ahead of an attempt at its door,
    oldest first: whether the attempt starts (a slot is left after every waiter ahead
    took one), and the waiters ahead that take a slot now."""
    granted = list(ahead[: max(free, 0)])
    return len(ahead) < free, granted


def next_turn(
    booked_until: datetime | None, now: datetime, interval: timedelta
) -> tuple[datetime, datetime]:
    """A rate's turn for an attempt arriving ``now`` (the key's turns are booked until
    ``booked_until``) and the key's next free turn after it."""
    turn = now if booked_until is None or booked_until < now else booked_until
    return turn, turn + interval


#: The longest a body waits in its worker for its start (at most two turns of its rate):
#: a message that comes this close to its start waits there rather than go round again.
WAIT_IN_PLACE = timedelta(milliseconds=250)


def start_of(turn: datetime, last_start: datetime | None, interval: timedelta) -> datetime:
    """When a body booked for ``turn`` may start: at its turn, and a whole interval after
    the key's last start (a message that came late does not start in a burst with the
    next one)."""
    return turn if last_start is None else max(turn, last_start + interval)


def waits_in_place(start: datetime, now: datetime, interval: timedelta) -> bool:
    """Whether a body that may start at ``start`` waits for it in its worker."""
    return start - now <= min(WAIT_IN_PLACE, 2 * interval)
