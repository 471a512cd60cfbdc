"""Idempotency keys (guarantee 9).

Derived from (execution, step, occurrence, direction) and never from the attempt number, so a
retry or a crash-resume sees the same key while another run of the same saga sees another.
"""

from __future__ import annotations

from typing import Literal

Direction = Literal["forward", "compensate"]


def idempotency_key(
    execution_id: str, step_name: str, occurrence: int, direction: Direction
) -> str:
    return f"{execution_id}:{step_name}:{occurrence}:{direction}"
