"""Checking the arguments of the engine's public calls: ages, enum filters, actors and
reasons."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from celery_saga.errors import SagaError
from celery_saga.limits import text_problem


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


def check_actor(actor: str | None) -> None:
    """An actor is a name (``user@host``, a web user), recorded in the run's history."""
    if actor is not None and not isinstance(actor, str):
        raise SagaError(f"an actor is text (who acts), got {type(actor).__name__}")
    if actor is not None:
        _storable(actor, "an actor")


def check_reason(reason: str | None, what: str) -> None:
    """A reason (why a run is cancelled or its unwind abandoned) is text, or None."""
    if reason is not None and not isinstance(reason, str):
        raise SagaError(f"{what} is text, got {type(reason).__name__}")
    if reason is not None:
        _storable(reason, what)


def _storable(text: str, what: str) -> None:
    """Text columns take any length, but not what a driver refuses (PostgreSQL: a NUL)."""
    problem = text_problem(text, len(text))
    if problem is not None:
        raise SagaError(f"{what} {problem}")
