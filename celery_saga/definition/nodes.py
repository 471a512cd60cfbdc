"""Node types of a saga graph: frozen dataclasses produced by the builder."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, assert_never

from celery_saga.definition.flow import Limit, Rate

#: Maps the saga context to the keyword arguments a step or compensation is called with.
ArgsMapper = Callable[[Any], Mapping[str, Any]]

#: ``name:<digits>`` names one iteration of a loop body step; no other suffix does.
_ITERATION = re.compile(r"^(?P<base>.+):(?P<index>\d+)$")


def iteration_name(step_name: str, iteration: int) -> str:
    """The record name of ``step_name``'s iteration ``iteration`` (0-based)."""
    return f"{step_name}:{iteration}"


def split_iteration(record_name: str) -> tuple[str, int | None]:
    """``("charge", 2)`` for ``charge:2``; ``("charge:extra", None)`` for anything else."""
    match = _ITERATION.match(record_name)
    if match is None:
        return record_name, None
    return match["base"], int(match["index"])


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
    #: The step's whole result is sensitive (see ``definition/sensitivity.py``).
    sensitive: bool = False
    #: What its final failure does ("unwind" or "hold"; None: its saga's policy), and after
    #: how many seconds a hold with no move unwinds (see ``definition/failure_policy.py``).
    on_failure: str | None = None
    hold_timeout: float | None = None
    #: At most so many bodies of the step's task in flight per key, across runs and
    #: workers, or a rate per key (see ``definition/flow.py``); None: no limit.
    concurrency: Limit | None = None
    rate: Rate | None = None

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


@dataclass(frozen=True)
class WaitNode:
    """Parks the run until the signal ``event`` arrives; fails it after ``timeout`` seconds
    (``None``: no deadline)."""

    event: str
    timeout: float | None


@dataclass(frozen=True)
class SubSagaNode:
    """Runs the registered saga ``saga`` as a child; ``name`` is its record in the parent.
    ``input`` maps the parent's context to the child's input (default: the parent's input)."""

    name: str
    saga: str
    input: ArgsMapper | None = None


class LoopKind(str, Enum):
    UNTIL = "do_until"  # body first, then the condition: stop once it is True
    WHILE = "do_while"  # the condition first: run the body while it is True


@dataclass(frozen=True)
class LoopNode:
    """Runs ``steps`` once per iteration; iteration ``i`` of step ``s`` is recorded as
    ``s:i``. The condition sees the context with every iteration so far."""

    name: str
    kind: LoopKind
    condition: Callable[[Any], Any]
    steps: tuple[StepSpec, ...]
    max_iterations: int


@dataclass(frozen=True)
class ForEachNode:
    """Runs ``step`` once per element of ``items(context)``, in order, as ``step:<index>``."""

    name: str
    items: Callable[[Any], Any]
    step: StepSpec
    max_iterations: int


Node = (
    StepNode
    | ParallelNode
    | BranchNode
    | PivotNode
    | WaitNode
    | SubSagaNode
    | LoopNode
    | ForEachNode
)


def node_steps(node: Node) -> tuple[StepSpec, ...]:
    """Every step a node may run (all paths of a branch, the body of a loop)."""
    match node:
        case StepNode(step) | ForEachNode(step=step):
            return (step,)
        case ParallelNode(steps=steps) | LoopNode(steps=steps):
            return steps
        case BranchNode(paths=paths):
            return tuple(step for path in paths.values() for step in path)
        case PivotNode() | WaitNode() | SubSagaNode():
            return ()
        case _:
            assert_never(node)


def node_name(node: Node) -> str:
    """A node as an operator knows it: its step's name, its own, ``wait_for('event')``."""
    match node:
        case StepNode():
            return node.step.name
        case WaitNode():
            return f"wait_for({node.event!r})"
        case ParallelNode() | BranchNode() | SubSagaNode() | LoopNode() | ForEachNode():
            return node.name or "pivot"
        case PivotNode():
            return "pivot"
        case _:
            assert_never(node)


def loop_body(node: Node) -> tuple[StepSpec, ...]:
    """The steps a loop repeats (empty for any other node)."""
    match node:
        case LoopNode(steps=steps):
            return steps
        case ForEachNode(step=step):
            return (step,)
        case _:
            return ()
