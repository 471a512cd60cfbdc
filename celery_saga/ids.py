"""Execution ids: UUID version 7 (RFC 9562), time-ordered.

The first 48 bits are the Unix time in milliseconds, the next 12 the fraction of that
millisecond (the RFC's "increased clock precision"), the last 62 random. Within a process
each id's (milliseconds, fraction) is greater than the previous one's, even when the clock
is coarse or steps back (the RFC's monotonic counter, section 6.2), so ids made one after
another sort in that order. Runs started together get ids that sort together, so every index
keyed by the run's id (the run row, its steps, its history, and the archive's copies of them)
takes new rows at its right-hand end, and retention, which retires runs oldest first, removes
and archives neighbouring entries: a batch dirties a few index pages instead of one page per
run. See docs/scaling.md.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_MILLION = 1_000_000
_lock = threading.Lock()
#: The last (milliseconds << 12 | 4096ths) handed out in this process.
_last = 0


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork while another thread held it would leave it held


os.register_at_fork(after_in_child=_reset_after_fork)


def _next_stamp() -> int:
    """Milliseconds (48 bits) and 4096ths of the millisecond (12 bits) as one number, greater
    than the last one handed out (a full millisecond carries into the next)."""
    global _last
    millis, rest = divmod(time.time_ns(), _MILLION)
    stamp = (millis & ((1 << 48) - 1)) << 12 | rest * 4096 // _MILLION
    with _lock:
        _last = max(stamp, _last + 1)
        return _last


def uuid7() -> uuid.UUID:
    """A new version-7 UUID: milliseconds, version, a 4096th of the millisecond, variant,
    62 random bits."""
    stamp = _next_stamp()
    value = (stamp >> 12) << 80 | 0x7 << 76 | (stamp & 0xFFF) << 64 | 0b10 << 62
    value |= int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def new_execution_id() -> str:
    """The id of a run started without one."""
    return str(uuid7())
