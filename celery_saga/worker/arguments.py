"""Checking the arguments of the engine's public calls: ages and enum filters."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from celery_saga.errors import SagaError


def check_age(value: float | timedelta, what: str) -> timedelta:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise SagaError(f"{what} must be a number of seconds >= 0 or a timedelta, got {value!r}")
    return timedelta(seconds=seconds)


def enum_values(kind: type[Any], values: Any, what: str) -> list[Any]:
    if values is None:
        return []
    items = [values] if isinstance(values, (str, kind)) else list(values)
    try:
        return [kind(v) for v in items]
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise SagaError(f"unknown {what} in {items!r}; expected one of: {allowed}") from None
