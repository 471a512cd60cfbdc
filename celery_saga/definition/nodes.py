"""Node types of a saga graph: frozen dataclasses produced by the builder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Maps the saga context to the keyword arguments a step or compensation is called with.
ArgsMapper = Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class StepSpec:
    """One unit of forward work and its optional reversal.

    ``action`` and ``compensation`` are Celery tasks or plain callables. ``retry`` is the number
    of attempts (>= 1); ``timeout`` and ``compensation_timeout`` are seconds (``None``: no
    forward timeout, and the engine's default reversal timeout for the compensation).
    """

    name: str
    action: Any
    compensation: Any = None
    retry: int = 1
    backoff: float = 0.5
    backoff_max: float = 30.0
    timeout: float | None = None
    compensation_retry: int = 3
    compensation_timeout: float | None = None
    args: ArgsMapper | None = None
    compensation_args: ArgsMapper | None = None
    input_schema: Any = None
    output_schema: Any = None
    is_transform: bool = False

    @property
    def compensatable(self) -> bool:
        return self.compensation is not None


@dataclass(frozen=True)
class StepNode:
    step: StepSpec


@dataclass(frozen=True)
class ParallelNode:
    name: str
    steps: tuple[StepSpec, ...]


@dataclass(frozen=True)
class BranchNode:
    """Runs the steps of the path ``selector(context)`` names, in order."""

    name: str
    selector: Callable[[Any], str]
    paths: Mapping[str, tuple[StepSpec, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PivotNode:
    """Past this point the saga is committed: nothing in it is compensated any more."""


Node = StepNode | ParallelNode | BranchNode | PivotNode


def node_steps(node: Node) -> tuple[StepSpec, ...]:
    """Every step a node may run (all paths of a branch)."""
    if isinstance(node, StepNode):
        return (node.step,)
    if isinstance(node, ParallelNode):
        return node.steps
    if isinstance(node, BranchNode):
        return tuple(step for path in node.paths.values() for step in path)
    return ()
