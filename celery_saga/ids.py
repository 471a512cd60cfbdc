"""Execution ids: UUID version 7 (RFC 9562), time-ordered.

The first 48 bits are the Unix time in milliseconds, the next 12 the fraction of that
millisecond (the RFC's "increased clock precision", so ids made one after another in a
process sort in that order), the last 62 random. Runs started together get ids that sort
together, so every index keyed by the run's id (the run row, its steps, its history, and the
archive's copies of them) takes new rows at its right-hand end, and retention, which retires
runs oldest first, removes and archives neighbouring entries: a batch dirties a few index
pages instead of one page per run. See docs/scaling.md.
"""

from __future__ import annotations

import os
import time
import uuid

_MILLION = 1_000_000


def uuid7() -> uuid.UUID:
    """A new version-7 UUID: milliseconds, version, a 4096th of the millisecond, variant,
    62 random bits."""
    now = time.time_ns()
    millis, fraction = divmod(now, _MILLION)
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= (fraction * 4096 // _MILLION) << 64
    value |= 0b10 << 62  # variant
    value |= int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def new_execution_id() -> str:
    """The id of a run started without one."""
    return str(uuid7())
