"""Flow control by key: the limits a saga declares (guarantee 37).

``Limit(key=..., max=N)`` on ``Saga(..., concurrency=)``: at most ``N`` runs of one key are
live at once; a run started beyond it is stored ``queued`` and starts when a run of its key
ends (see docs/flow-control.md). ``key`` is a function of the run's input returning the key
(a string), or None for one key shared by every run of the saga.

On ``step(..., concurrency=Limit(...))`` the same limit counts bodies of the step's task in
flight per key, across runs and workers; ``step(..., rate=Rate("20/s", key=...))`` starts
at most so many bodies per second per key. A step that must wait keeps no worker slot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_saga.errors import DefinitionError, SagaError
from celery_saga.limits import NAME_LENGTH, text_problem

#: A key function: the run's input in, the key out.
KeyFunction = Callable[[Mapping[str, Any]], Any]

#: The key of a limit without a key function: one key for all the saga's runs.
WHOLE_SAGA = "*"

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")


@dataclass(frozen=True)
class Limit:
    """At most ``max`` live at once per key; ``key(input)`` names the key (None: one key);
    ``total``: at most so many live across the saga's keys."""

    key: KeyFunction | None = None
    max: int = 1
    #: At most so many live runs of the saga across all its keys; a slot that frees goes
    #: to the key whose run waited longest.
    total: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1:
            raise DefinitionError(f"Limit(max=) takes an integer of at least 1, got {self.max!r}")
        if self.total is not None and (
            isinstance(self.total, bool) or not isinstance(self.total, int) or self.total < 1
        ):
            raise DefinitionError(
                f"Limit(total=) takes an integer of at least 1 (or None), got {self.total!r}"
            )
        if self.total is not None and self.key is None:
            raise DefinitionError("Limit(total=) needs a key=: without one, max= is the total")
        if self.key is not None and not callable(self.key):
            raise DefinitionError(
                f"Limit(key=) takes a function of the input (or None), got {self.key!r}"
            )


@dataclass(frozen=True)
class Rate:
    """At most ``per_second`` calls per second per key; ``Rate("20/s")``, ``"90/m"``, ``"5/h"``."""

    spec: str
    key: KeyFunction | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or _RATE.match(self.spec) is None:
            raise DefinitionError(
                f"Rate() takes a rate such as '20/s', '90/m' or '5/h', got {self.spec!r}"
            )
        if self.per_second <= 0:
            raise DefinitionError(f"Rate({self.spec!r}) must allow more than zero calls")
        if self.key is not None and not callable(self.key):
            raise DefinitionError(
                f"Rate(key=) takes a function of the input (or None), got {self.key!r}"
            )

    @property
    def per_second(self) -> float:
        match = _RATE.match(self.spec)
        assert match is not None
        return float(match.group(1)) / _PERIODS[match.group(2)]


def run_limit(saga: str, concurrency: object) -> Limit | None:
    """``Saga(..., concurrency=)`` checked: a ``Limit`` or None."""
    if concurrency is None or isinstance(concurrency, Limit):
        return concurrency
    raise DefinitionError(
        f"saga {saga!r}: concurrency= takes a Limit(key=..., max=N), got {concurrency!r}"
    )


def step_limits(step: str, concurrency: object, rate: object) -> dict[str, Any]:
    """``step(..., concurrency=, rate=)`` checked: a ``Limit``, a ``Rate``, or neither."""
    if concurrency is not None and not isinstance(concurrency, Limit):
        raise DefinitionError(
            f"step {step!r}: concurrency= takes a Limit(key=..., max=N), got {concurrency!r}"
        )
    if rate is not None and not isinstance(rate, Rate):
        raise DefinitionError(f"step {step!r}: rate= takes a Rate('20/s', key=...), got {rate!r}")
    if concurrency is not None and concurrency.total is not None:
        raise DefinitionError(f"step {step!r}: a step's Limit takes no total= (a saga's does)")
    if concurrency is not None and rate is not None:
        raise DefinitionError(
            f"step {step!r}: takes concurrency= or rate=, not both (put the other on a step "
            "of its own)"
        )
    return {"concurrency": concurrency, "rate": rate}


def key_of(saga: str, limit: Limit | Rate, saga_input: Mapping[str, Any]) -> str:
    """The key ``limit`` gives a run of ``saga`` started with ``saga_input``; a key that
    cannot be stored is refused before anything is stored."""
    if limit.key is None:
        return WHOLE_SAGA
    kind = "rate" if isinstance(limit, Rate) else "concurrency"
    try:
        key = limit.key(saga_input)
    except Exception as error:
        raise SagaError(
            f"saga {saga!r}: the {kind} key function raised {type(error).__name__}: {error}"
        ) from error
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    problem = text_problem(key, NAME_LENGTH, "saga_executions.flow_key")
    if problem is None and key == "":
        problem = "is empty"
    if problem is not None:
        raise SagaError(f"saga {saga!r}: the {kind} key {key!r:.100} {problem}")
    assert isinstance(key, str)
    return key
