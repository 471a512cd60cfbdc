"""The saga context a step or compensation receives when it asks for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SagaContext:
    """What a step knows about its run.

    ``input`` is the saga input (after the step's input schema, if any); ``results`` maps
    every completed earlier step to its result. A compensation also gets ``forward_result``
    (its step's result, ``None`` if the step failed) and ``forward_key`` (its step's key);
    ``idempotency_key`` is always the key of the current direction.
    """

    execution_id: str
    saga_name: str
    step_name: str
    input: Any
    results: Mapping[str, Any]
    idempotency_key: str
    attempt: int
    forward_key: str | None = None
    forward_result: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)
