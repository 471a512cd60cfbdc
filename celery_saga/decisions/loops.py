"""Loop decisions (guarantees 11, 12, 24): which iteration runs next, and what a loop's
journaled condition or item list may look like.

A loop's position is one number, ``sub = iteration * len(body) + index in body``, so the
cursor, admission and the records work for loops exactly as for branch paths.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from celery_saga.definition.nodes import LoopKind


class LoopVerdict(str, Enum):
    RUN = "run"  # run this iteration
    DONE = "done"  # the loop is finished; move past it
    EXCEEDED = "exceeded"  # the loop wants another iteration beyond max_iterations


def loop_position(sub: int, body_length: int) -> tuple[int, int]:
    """(iteration, index in the body) of a loop position."""
    return divmod(sub, body_length)


def needs_condition(kind: LoopKind, iteration: int) -> bool:
    """do_until runs its first iteration unconditionally; do_while checks before each."""
    return kind is LoopKind.WHILE or iteration > 0


def loop_verdict(
    kind: LoopKind, iteration: int, condition: bool | None, max_iterations: int
) -> LoopVerdict:
    """Whether iteration ``iteration`` runs. ``condition`` is the journaled value checked
    before it (do_while) or after the one before it (do_until; None for iteration 0)."""
    run = (iteration == 0 or not condition) if kind is LoopKind.UNTIL else bool(condition)
    if not run:
        return LoopVerdict.DONE
    if iteration >= max_iterations:
        return LoopVerdict.EXCEEDED
    return LoopVerdict.RUN


def for_each_verdict(index: int, count: int) -> LoopVerdict:
    return LoopVerdict.RUN if index < count else LoopVerdict.DONE


def condition_problem(value: Any) -> str | None:
    """Why a condition's value cannot be journaled, or None: it must be exactly a bool."""
    if isinstance(value, bool):
        return None
    kind = type(value).__name__
    return f"returned {value!r} ({kind}); a loop condition must return True or False"


def items_problem(value: Any, max_iterations: int) -> str | None:
    """Why for_each items cannot be journaled, or None: a list (or tuple) within the limit."""
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__} {value!r:.80}; for_each items must be a list"
    if len(value) > max_iterations:
        return f"returned {len(value)} items, more than max_iterations={max_iterations}"
    return None
