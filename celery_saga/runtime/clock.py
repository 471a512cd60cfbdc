"""One injectable source of time and randomness (guarantee 25).

Every timestamp, deadline, lease and jitter in the library is drawn from ``get_clock()``, so a
test can install a ``celery_saga.testing.ControlledClock`` and replay a run exactly.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


class SystemClock:
    """Wall-clock time and the process's random generator."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def random(self) -> float:
        return random.random()


_clock: Clock = SystemClock()


def get_clock() -> Clock:
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Install ``clock`` for the whole process and return the one it replaces."""
    global _clock
    previous, _clock = _clock, clock
    return previous
