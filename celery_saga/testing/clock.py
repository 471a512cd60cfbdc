"""A controllable clock for tests: time moves only when told to (guarantee 25)."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone


class ControlledClock:
    """A clock that moves only when told to, with seeded randomness.

    Install it with ``celery_saga.set_clock(ControlledClock(seed=7))``: every timestamp,
    lease, deadline and backoff jitter the engine computes then comes from it, so a run can
    be replayed exactly.
    """

    def __init__(self, start: datetime | None = None, seed: int = 0) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=timezone.utc)
        if self._now.tzinfo is None:
            raise ValueError("ControlledClock needs a timezone-aware start time")
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def random(self) -> float:
        with self._lock:
            return self._random.random()

    def advance(self, seconds: float) -> datetime:
        """Move time forward and return the new now."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


__all__ = ["ControlledClock"]
