"""May this process carry out a stored bulk operation? (guarantee 36)

One process at a time carries an operation out: it holds the operation's lease, renewed
while it works, and gives it up when it finishes or stops on an error. Two processes
walking the same pages could otherwise both move a run that returned to a state the move
acts on in between (a retried run that failed at once and was held again). Another process
may take the operation over when no one holds it, when its holder's lease has lapsed, or
at once when its holder was a process of this machine that is gone (a ``--resume`` right
after a kill).

A holder is named ``host:pid:space:token``: ``space`` names the machine's process table (a
container has its own), so a pid is only ever looked up where it means the same process;
``token`` tells two holds of one process apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    #: The process table the pid is in ("" when it could not be told: never judged gone).
    space: str
    token: str

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.space}:{self.token}"

    @property
    def shown(self) -> str:
        return f"{self.host} pid {self.pid}"


def parse_holder(text: str | None) -> Holder | None:
    """The holder a stored ``text`` names; None for none, or for a text this code did not
    write (treated as someone else's, held until its lease lapses)."""
    if not text:
        return None
    parts = text.rsplit(":", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return Holder(parts[0], int(parts[1]), parts[2], parts[3])


class LeaseVerdict(str, Enum):
    #: No one holds it: take it.
    FREE = "free"
    #: Its holder's lease lapsed: take it.
    LAPSED = "lapsed"
    #: Its holder was a process of this machine that is gone: take it at once.
    GONE = "gone"
    #: Another process holds it: refuse.
    HELD = "held"


def may_take(
    stored: str | None,
    lease_until: datetime | None,
    now: datetime,
    here: Holder,
    alive: bool | None,
) -> LeaseVerdict:
    """Whether ``here`` may take an operation ``stored`` holds until ``lease_until``.
    ``alive``: whether the holder's pid runs on this machine (None: not asked, or not
    this machine's process table)."""
    if not stored:
        return LeaseVerdict.FREE
    if lease_until is None or lease_until <= now:
        return LeaseVerdict.LAPSED
    holder = parse_holder(stored)
    if holder is not None and alive is False and same_process_table(holder, here):
        return LeaseVerdict.GONE
    return LeaseVerdict.HELD


def same_process_table(holder: Holder, here: Holder) -> bool:
    """Whether ``holder``'s pid can be looked up here (the same host's process table)."""
    return bool(here.space) and (holder.host, holder.space) == (here.host, here.space)
