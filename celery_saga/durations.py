"""Durations as operators type them: ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``."""

from __future__ import annotations

import re
from datetime import timedelta

from celery_saga.errors import SagaError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
#: The longest duration taken: an age counted back from now stays a date (year 1 is the
#: first ``datetime`` has), and no age of a run is longer.
LONGEST = timedelta(days=1000 * 365)


def parse_duration(text: str) -> timedelta:
    """A number of seconds, or a number with one unit of s, m, h, d or w, at most
    ``LONGEST``."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise SagaError(
            f"{text!r} is not a duration; use a number with s, m, h, d or w, e.g. 7d or 30m"
        )
    number, unit = match.groups()
    seconds = float(number) * _UNITS[unit or "s"]
    if seconds > LONGEST.total_seconds():  # inf included: timedelta would overflow
        raise SagaError(f"{text!r:.40} is longer than {LONGEST.days // 365} years")
    return timedelta(seconds=seconds)


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*$")


def parse_rate(text: str) -> float:
    """A rate as operators type it: ``50/s``, ``600/m``, ``1000/h`` or a bare number per
    second; returns actions per second, more than 0."""
    match = _RATE.match(text.lower())
    if match is None:
        raise SagaError(f"{text!r:.40} is not a rate; use a number per s, m or h, e.g. 50/s")
    number, unit = match.groups()
    rate = float(number) / _UNITS[unit or "s"]
    if rate <= 0:
        raise SagaError(f"{text!r:.40}: a rate must be above zero")
    return rate
