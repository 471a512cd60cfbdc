"""What a step's final failure does to its run: ``unwind`` (the default: the run fails and
its completed steps are reversed) or ``hold`` (the run waits in state ``held`` for an
operator's move: retry, skip, unwind or cancel; nothing is reversed meanwhile).

A step names its policy (``step(..., on_failure=, hold_timeout=)``) or takes its saga's
(``Saga(..., on_failure=, hold_timeout=)``). ``hold_timeout`` (seconds): a run held that
long with no move is unwound by the timer sweep. A member of a parallel group always
unwinds: its group settles together, so one member cannot wait alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery_saga.errors import DefinitionError

UNWIND = "unwind"
HOLD = "hold"
POLICIES = (UNWIND, HOLD)


@dataclass(frozen=True)
class FailurePolicy:
    """A step's resolved policy: hold or not, and after how long a hold unwinds."""

    hold: bool = False
    hold_timeout: float | None = None


def check_policy(where: str, on_failure: Any, hold_timeout: Any) -> float | None:
    """``on_failure`` and ``hold_timeout`` as given to a step or a saga, checked (None:
    not given there); returns the timeout in seconds."""
    if on_failure is not None and on_failure not in POLICIES:
        raise DefinitionError(f"{where}: on_failure= takes 'unwind' or 'hold', got {on_failure!r}")
    seconds = positive_seconds(where, "hold_timeout", hold_timeout)
    if seconds is not None and on_failure == UNWIND:
        raise DefinitionError(f"{where}: hold_timeout= applies only with on_failure='hold'")
    return seconds


def positive_seconds(where: str, option: str, value: Any) -> float | None:
    """A duration option (seconds or a timedelta), checked: a positive number, or None."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise DefinitionError(
            f"{where}: {option}= takes a positive number of seconds or a timedelta, got {value!r}"
        )
    return float(seconds)


def resolve(
    step_policy: str | None,
    step_timeout: float | None,
    saga_policy: str | None,
    saga_timeout: float | None,
    *,
    in_group: bool,
) -> FailurePolicy:
    """Pure: the policy a step's final failure follows (the step's own, else its saga's)."""
    policy = step_policy or saga_policy or UNWIND
    if policy != HOLD or in_group:
        return FailurePolicy()
    return FailurePolicy(True, step_timeout if step_timeout is not None else saga_timeout)
