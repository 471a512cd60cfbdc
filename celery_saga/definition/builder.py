"""The fluent builder: ``Saga(name).step(...).parallel(...).branch(...).pivot()``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_saga.definition.hashing import structural_hash
from celery_saga.definition.nodes import (
    ArgsMapper,
    BranchNode,
    Node,
    ParallelNode,
    PivotNode,
    StepNode,
    StepSpec,
    node_steps,
)
from celery_saga.definition.validation import validate_saga, validate_step
from celery_saga.errors import DefinitionError

#: Attribute the ``compensated_by`` decorator sets on a Celery task or function.
COMPENSATION_ATTRIBUTE = "__saga_compensation__"


def compensated_by(compensation: Any) -> Callable[[Any], Any]:
    """Attach a default compensation to a Celery task (or function), leaving it unchanged.

    The task keeps working as an ordinary task outside sagas; inside one, a step built from
    it is compensated by ``compensation`` unless the step names another.
    """

    def mark(action: Any) -> Any:
        setattr(action, COMPENSATION_ATTRIBUTE, compensation)
        return action

    return mark


def _default_name(action: Any) -> str:
    task_name = getattr(action, "name", None)
    if isinstance(task_name, str) and task_name:
        return task_name.rsplit(".", 1)[-1]
    function_name = getattr(action, "__name__", None)
    if isinstance(function_name, str) and function_name != "<lambda>":
        return function_name
    raise DefinitionError(f"cannot derive a step name from {action!r}; pass one explicitly")


def step(
    name: str | Any,
    action: Any = None,
    *,
    compensate: Any = None,
    retry: int = 1,
    backoff: float = 0.5,
    backoff_max: float = 30.0,
    timeout: float | None = None,
    compensation_retry: int = 3,
    compensation_timeout: float | None = None,
    args: ArgsMapper | None = None,
    compensation_args: ArgsMapper | None = None,
    input_schema: Any = None,
    output_schema: Any = None,
) -> StepSpec:
    """Describe one step; ``step(task)`` names it after the task's last dotted component."""
    if action is None and not isinstance(name, str):
        name, action = _default_name(name), name
    if compensate is None:
        compensate = getattr(action, COMPENSATION_ATTRIBUTE, None)
    return StepSpec(
        name=name,
        action=action,
        compensation=compensate,
        retry=retry,
        backoff=backoff,
        backoff_max=backoff_max,
        timeout=timeout,
        compensation_retry=compensation_retry,
        compensation_timeout=compensation_timeout,
        args=args,
        compensation_args=compensation_args,
        input_schema=input_schema,
        output_schema=output_schema,
    )


@dataclass(frozen=True)
class Path:
    name: str
    steps: tuple[StepSpec, ...]


def path(name: str, *steps: StepSpec) -> Path:
    """One named path of a ``branch``."""
    return Path(name, steps)


@dataclass(frozen=True)
class SagaDefinition:
    """A sealed, immutable saga graph with its structural hash (guarantee 22)."""

    name: str
    nodes: tuple[Node, ...]
    hash: str

    def find_step(self, name: str) -> StepSpec | None:
        for node in self.nodes:
            for spec in node_steps(node):
                if spec.name == name:
                    return spec
        return None


class Saga:
    """Fluent builder of a saga definition. Sealed by ``SagaEngine.register``."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise DefinitionError(f"a saga needs a non-empty string name, got {name!r}")
        self.name = name
        self._nodes: list[Node] = []
        self._sealed: SagaDefinition | None = None

    def _add(self, node: Node) -> Saga:
        if self._sealed is not None:
            raise DefinitionError(f"saga {self.name!r} is registered and sealed; build a new Saga")
        self._nodes.append(node)
        return self

    def step(self, name: str | Any, action: Any = None, **options: Any) -> Saga:
        """Append a step; options as for :func:`celery_saga.step`."""
        spec = step(name, action, **options)
        validate_step(self.name, spec)
        return self._add(StepNode(spec))

    def parallel(self, name: str, *steps: StepSpec) -> Saga:
        """Run ``steps`` concurrently; the group fails if any member fails."""
        for spec in steps:
            validate_step(self.name, spec)
        return self._add(ParallelNode(name, tuple(steps)))

    def branch(self, name: str, selector: Callable[[Any], str], *paths: Path) -> Saga:
        """Run the path whose name ``selector(context)`` returns."""
        mapping: dict[str, tuple[StepSpec, ...]] = {}
        for item in paths:
            if item.name in mapping:
                raise DefinitionError(
                    f"saga {self.name!r}: branch {name!r} defines path {item.name!r} twice"
                )
            for spec in item.steps:
                validate_step(self.name, spec)
            mapping[item.name] = item.steps
        return self._add(BranchNode(name, selector, mapping))

    def map(self, name: str, transform: Callable[[Any], Any]) -> Saga:
        """A pure transform of the context; its value is stored as the result ``name``."""
        spec = StepSpec(name=name, action=transform, is_transform=True)
        validate_step(self.name, spec)
        return self._add(StepNode(spec))

    def pivot(self) -> Saga:
        """Commit point: once passed, no step of this run is ever compensated."""
        return self._add(PivotNode())

    def seal(self) -> SagaDefinition:
        """Validate the whole graph and freeze it; idempotent."""
        if self._sealed is None:
            nodes = tuple(self._nodes)
            validate_saga(self.name, nodes)
            self._sealed = SagaDefinition(self.name, nodes, structural_hash(self.name, nodes))
        return self._sealed
