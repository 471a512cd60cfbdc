"""Backoff between attempts: exponential, capped, with up to 50% jitter."""

from __future__ import annotations


def backoff_delay(attempt: int, base: float, cap: float, random_fraction: float) -> float:
    """Seconds to wait after failed ``attempt`` (1-based); ``random_fraction`` in [0, 1)."""
    # The exponent is bounded first: 2 ** 1100 as a float overflows.
    delay = min(base * 2.0 ** min(attempt - 1, 64), cap)
    return delay * (1 + 0.5 * random_fraction)
