"""The saga context a step or compensation receives when it asks for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_saga.definition.nodes import split_iteration


@dataclass(frozen=True)
class SagaContext:
    """What a step knows about its run.

    ``input`` is the saga input (after the step's input schema, if any); ``results`` maps
    every completed earlier step to its result (loop iterations as ``name:<i>``, and the
    latest one under the bare name); ``signals`` maps each received event to its payload.
    A compensation also gets ``forward_result`` (its step's result, ``None`` if the step
    failed) and ``forward_key`` (its step's key); ``idempotency_key`` is always the key of
    the current direction. Inside a loop ``iteration`` is the 0-based iteration and, for
    ``for_each``, ``item`` its element.
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
    signals: Mapping[str, Any] = field(default_factory=dict)
    iteration: int | None = None
    item: Any = None

    @property
    def fencing_token(self) -> int:
        """The generation of this attempt's claim: larger for every later claim of the same
        step (or reversal). Hand it to a system that refuses writes carrying a smaller one,
        so a body whose claim was taken over cannot overwrite newer work (guarantee 30)."""
        return self.attempt

    @property
    def cancelled(self) -> bool:
        """Whether this run was cancelled while the step runs (one read of the run): a
        body the pool cannot stop checks it between units of work (guarantee 31)."""
        from celery_saga.runtime.holders import cancelled

        return cancelled()

    def iterations(self, step_name: str) -> list[Any]:
        """Results of every completed iteration of the loop body step ``step_name``, in
        iteration order."""
        found = []
        for name, value in self.results.items():
            base, index = split_iteration(name)
            if base == step_name and index is not None:
                found.append((index, value))
        return [value for _, value in sorted(found, key=lambda pair: pair[0])]
