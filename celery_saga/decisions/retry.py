"""Backoff between attempts: exponential, capped, with up to 50% jitter."""

from __future__ import annotations


def backoff_delay(attempt: int, base: float, cap: float, random_fraction: float) -> float:
    """Seconds to wait after failed ``attempt`` (1-based); ``random_fraction`` in [0, 1)."""
    # The exponent is bounded first: 2 ** 1100 as a float overflows.
    delay = min(base * 2.0 ** min(attempt - 1, 64), cap)
    return delay * (1 + 0.5 * random_fraction)


def plan_retry(
    attempt: int,
    attempts: int,
    requested: tuple[float, int | None] | None,
    backoff: tuple[float, float],
    random_fraction: float,
) -> float | None:
    """Seconds until the next attempt after failed ``attempt``, or None when the failure
    is final. ``attempts`` is the step's ``retry`` (attempts allowed on any error);
    ``requested`` the (countdown, max_retries) a task's own ``self.retry()`` asked for,
    which Celery would honour while ``attempt <= max_retries`` (None: no limit)."""
    if requested is not None:
        countdown, max_retries = requested
        if max_retries is not None and attempt > max_retries:
            return None
        return countdown
    if attempt >= attempts:
        return None
    return backoff_delay(attempt, backoff[0], backoff[1], random_fraction)
