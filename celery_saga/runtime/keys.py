"""Idempotency keys (guarantee 9).

Derived from (execution, step, occurrence, direction) and never from the attempt number, so a
retry or a crash-resume sees the same key while another run of the same saga sees another.
"""

from __future__ import annotations

from typing import Literal

from celery_saga.definition.nodes import split_iteration

Direction = Literal["forward", "compensate"]


def idempotency_key(
    execution_id: str, step_name: str, occurrence: int, direction: Direction
) -> str:
    return f"{execution_id}:{step_name}:{occurrence}:{direction}"


def record_key(execution_id: str, record_name: str, direction: Direction) -> str:
    """The key of a step record: a loop iteration ``charge:2`` is occurrence 2 of ``charge``."""
    base, iteration = split_iteration(record_name)
    return idempotency_key(execution_id, base, iteration or 0, direction)
