"""Checking the arguments of the engine's public calls: ages, enum filters, list pages,
actors and reasons."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from celery_saga.errors import SagaError
from celery_saga.limits import storable_cursor_id, text_problem
from celery_saga.store.queries import decode_cursor


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


def page_start(limit: object, cursor: object) -> tuple[datetime, str] | None:
    """``list()``'s ``limit`` checked, and where its ``cursor`` says the page starts."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise SagaError(f"limit must be an integer between 1 and 1000, got {limit!r}")
    if cursor is None:
        return None
    try:
        if not isinstance(cursor, str):
            raise ValueError(cursor)
        stamp, last_id = decode_cursor(cursor)
        return (stamp, storable_cursor_id(last_id))
    except (ValueError, UnicodeDecodeError):
        raise SagaError(f"{cursor!r} is not a cursor returned by list()") from None


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
