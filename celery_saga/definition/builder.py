"""The fluent builder: ``Saga(name).step(...).parallel(...).branch(...).pivot()``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import cached_property
from typing import Any

from celery_saga.definition.failure_policy import (
    FailurePolicy,
    check_policy,
    positive_seconds,
    resolve,
)
from celery_saga.definition.flow import Limit, Rate, run_limit, step_limits
from celery_saga.definition.hashing import structural_hash
from celery_saga.definition.nodes import (
    ArgsMapper,
    BranchNode,
    ForEachNode,
    LoopKind,
    LoopNode,
    Node,
    ParallelNode,
    PivotNode,
    StepNode,
    StepSpec,
    SubSagaNode,
    WaitNode,
    loop_body,
    node_steps,
    split_iteration,
)
from celery_saga.definition.sensitivity import Sensitivity, saga_sensitivity
from celery_saga.definition.validation import (
    check_iteration_names,
    check_max_iterations,
    check_stored_name,
    validate_saga,
    validate_step,
    wait_seconds,
)
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
    sensitive: bool = False,
    on_failure: str | None = None,
    hold_timeout: float | timedelta | None = None,
    concurrency: Limit | None = None,
    rate: Rate | None = None,
) -> StepSpec:
    """Describe one step; ``step(task)`` names it after the task's last dotted component.
    ``on_failure``: "unwind" (the default) or "hold", and ``hold_timeout`` (seconds or a
    timedelta): see ``definition/failure_policy.py``. ``concurrency``: a ``Limit``, at most
    so many bodies of the step's task in flight per key; ``rate``: a ``Rate`` per key (see
    docs/flow-control.md)."""
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
        sensitive=sensitive,
        on_failure=on_failure,
        hold_timeout=check_policy(f"step {name!r}", on_failure, hold_timeout),
        **step_limits(name, concurrency, rate),
    )


@dataclass(frozen=True)
class Path:
    name: str
    steps: tuple[StepSpec, ...]


def _only_specs(where: str, items: Sequence[Any]) -> tuple[StepSpec, ...]:
    """The members of a path or a parallel group: each must be a ``step(...)`` spec."""
    for item in items:
        if not isinstance(item, StepSpec):
            hint = " (wrap it: step(name, task))" if callable(item) else ""
            raise DefinitionError(
                f"{where} got {item!r:.80} ({type(item).__name__}){hint}; it holds only "
                "step(...) specs"
            )
    return tuple(items)


def path(name: str, *steps: StepSpec) -> Path:
    """One named path of a ``branch``."""
    return Path(name, _only_specs(f"path {name!r}", steps))


@dataclass(frozen=True)
class SagaDefinition:
    """A sealed, immutable saga graph with its structural hash (guarantee 22)."""

    name: str
    nodes: tuple[Node, ...]
    hash: str
    #: The explicit ``version=`` label, if the saga was given one.
    label: str | None = None
    #: Seconds after its start at which a run is cancelled (``Saga(..., timeout=)``).
    timeout: float | None = None
    #: What humans must not be shown (``sensitive=``); not part of ``hash``.
    sensitive: Sensitivity = field(default_factory=Sensitivity)
    #: The saga's failure policy for its steps (``Saga(..., on_failure=, hold_timeout=)``).
    on_failure: str | None = None
    hold_timeout: float | None = None
    #: At most so many live runs per key (``concurrency=``); not part of ``hash``.
    concurrency: Limit | None = None
    #: Each step by name, the first in node order where names repeat (a branch's paths):
    #: every reversal and retry looks its step up, so it is made once.
    _steps: dict[str, StepSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        steps: dict[str, StepSpec] = {}
        for node in self.nodes:
            for spec in node_steps(node):
                steps.setdefault(spec.name, spec)
        object.__setattr__(self, "_steps", steps)

    def find_step(self, name: str) -> StepSpec | None:
        """The spec of a step record: exact names first, then ``<loop body step>:<index>``
        (only a numeric suffix marks an iteration, so ``charge:extra`` never resolves to a
        loop body ``charge``)."""
        spec = self._steps.get(name)
        if spec is not None:
            return spec
        base, index = split_iteration(name)
        if index is None:
            return None
        for node in self.nodes:
            for spec in loop_body(node):
                if spec.name == base:
                    return spec
        return None

    def failure_policy(self, spec: StepSpec, node: int) -> FailurePolicy:
        """What the final failure of ``spec`` (at node ``node``) does to the run."""
        in_group = isinstance(self.nodes[node], ParallelNode)
        own = (spec.on_failure, spec.hold_timeout)
        return resolve(*own, self.on_failure, self.hold_timeout, in_group=in_group)

    def wait_position(self, event: str) -> int | None:
        """The index of the one ``wait_for`` gate of ``event`` (events are unique per saga)."""
        for index, node in enumerate(self.nodes):
            if isinstance(node, WaitNode) and node.event == event:
                return index
        return None

    @property
    def events(self) -> tuple[str, ...]:
        return tuple(node.event for node in self.nodes if isinstance(node, WaitNode))

    @property
    def child_sagas(self) -> frozenset[str]:
        return frozenset(node.saga for node in self.nodes if isinstance(node, SubSagaNode))

    @cached_property
    def reversible(self) -> frozenset[str]:
        """Record names this definition can reverse: steps with a compensation (a loop body
        step by its bare name) and sub-sagas (through the child's own unwind)."""
        names = {node.name for node in self.nodes if isinstance(node, SubSagaNode)}
        for node in self.nodes:
            names.update(spec.name for spec in node_steps(node) if spec.compensatable)
        return frozenset(names)


def _as_steps(saga: str, body: Any) -> tuple[StepSpec, ...]:
    """A loop body: one step spec, a sequence of them, or a task/callable to wrap."""
    if isinstance(body, StepSpec):
        return (body,)
    if isinstance(body, Sequence) and not isinstance(body, str):
        specs = tuple(body)
        if not specs or not all(isinstance(spec, StepSpec) for spec in specs):
            raise DefinitionError(
                f"saga {saga!r}: a loop body must be a step, a task, a callable or a "
                f"non-empty list of step(...) specs, got {body!r}"
            )
        return specs
    return (step(body),)


class Saga:
    """Fluent builder of a saga definition. Sealed by ``SagaEngine.register``.

    ``concurrency``: a ``Limit``: at most so many live runs per key, the others queued
    (docs/flow-control.md).

    ``sensitive``: dict key names marked at any depth of the input, results and signal
    payloads, or a callable ``(path, value) -> bool``; marked values are kept out of logs,
    failure texts, Celery's task results and ``celery saga show`` (see docs/redaction.md).
    """

    def __init__(
        self,
        name: str,
        *,
        version: str | None = None,
        timeout: float | timedelta | None = None,
        sensitive: Any = None,
        on_failure: str | None = None,
        hold_timeout: float | timedelta | None = None,
        concurrency: Limit | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise DefinitionError(f"a saga needs a non-empty string name, got {name!r}")
        check_stored_name("", "saga name", name, "saga_executions.saga_name")
        if version is not None and (not isinstance(version, str) or not version.strip()):
            raise DefinitionError(
                f"saga {name!r}: version= takes a non-empty string label, got {version!r}"
            )
        if version is not None:
            check_stored_name(f"saga {name!r}: ", "version label", version, "saga_versions.label")
        self.name = name
        self.version = version
        self.timeout = run_timeout(f"saga {name!r}", timeout)
        self.sensitive = saga_sensitivity(name, sensitive)
        self.on_failure = on_failure
        self.hold_timeout = check_policy(f"saga {name!r}", on_failure, hold_timeout)
        self.concurrency = run_limit(name, concurrency)
        self._nodes: list[Node] = []
        self._sealed: SagaDefinition | None = None

    def _add(self, node: Node) -> Saga:
        if self._sealed is not None:
            raise DefinitionError(f"saga {self.name!r} is registered and sealed; build a new Saga")
        self._nodes.append(node)
        return self

    def step(self, name: str | Any, action: Any = None, **options: Any) -> Saga:
        """Append a step; options as for [`step`][celery_saga.step]. A spec built with
        `step(...)` may be passed as it is."""
        if isinstance(name, StepSpec) and action is None and not options:
            spec = name
        else:
            spec = step(name, action, **options)
        validate_step(self.name, spec)
        return self._add(StepNode(spec))

    def parallel(self, name: str, *steps: StepSpec) -> Saga:
        """Run ``steps`` concurrently; the group fails if any member fails."""
        _only_specs(f"saga {self.name!r}: parallel group {name!r}", steps)
        for spec in steps:
            validate_step(self.name, spec)
            if spec.on_failure == "hold":
                raise DefinitionError(
                    f"saga {self.name!r}: step {spec.name!r} of parallel group {name!r} "
                    "cannot hold (on_failure='hold'): a group settles together"
                )
            if spec.concurrency is not None or spec.rate is not None:
                raise DefinitionError(
                    f"saga {self.name!r}: step {spec.name!r} of parallel group {name!r} "
                    "cannot take concurrency= or rate=: a group's members start together"
                )
        return self._add(ParallelNode(name, tuple(steps)))

    def branch(self, name: str, selector: Callable[[Any], str], *paths: Path) -> Saga:
        """Run the path whose name ``selector(context)`` returns."""
        mapping: dict[str, tuple[StepSpec, ...]] = {}
        for item in paths:
            if not isinstance(item, Path):
                raise DefinitionError(
                    f"saga {self.name!r}: branch {name!r} got {item!r:.80} "
                    f"({type(item).__name__}); it takes path(name, step(...), ...) items"
                )
            _only_specs(f"saga {self.name!r}: path {item.name!r} of branch {name!r}", item.steps)
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
        """Commit point: once passed, no step of this run is ever reversed."""
        return self._add(PivotNode())

    def wait_for(self, event: str, *, timeout: float | timedelta | None = None) -> Saga:
        """Park the run until ``engine.signal(id, event, payload)``; after ``timeout``
        (seconds or a timedelta; ``None`` waits for ever) the run fails and is unwound."""
        if not isinstance(event, str) or not event.strip():
            raise DefinitionError(
                f"saga {self.name!r}: wait_for needs a non-empty event name, got {event!r}"
            )
        check_stored_name(f"saga {self.name!r}: ", "event name", event, "saga_signals.event")
        return self._add(WaitNode(event, wait_seconds(self.name, event, timeout)))

    def sub_saga(
        self, saga: str, *, input: ArgsMapper | None = None, name: str | None = None
    ) -> Saga:
        """Run the registered saga ``saga`` as a child of this run. ``input(ctx)`` builds the
        child's input (default: this run's input); ``name`` is the child's record name here
        (default: ``saga``)."""
        if isinstance(saga, Saga):
            raise DefinitionError(
                f"saga {self.name!r}: sub_saga takes the child saga's name, got the builder of "
                f"{saga.name!r}; pass sub_saga({saga.name!r}) and register both sagas"
            )
        if not isinstance(saga, str) or not saga.strip():
            raise DefinitionError(f"saga {self.name!r}: sub_saga needs a saga name, got {saga!r}")
        check_stored_name(f"saga {self.name!r}: ", "sub_saga", saga, "saga_executions.saga_name")
        if input is not None and not callable(input):
            raise DefinitionError(
                f"saga {self.name!r}: the input of sub_saga {saga!r} must be callable"
            )
        record = name if name is not None else saga
        validate_step(self.name, StepSpec(name=record, action=_child_marker))
        return self._add(SubSagaNode(record, saga, input))

    def do_until(
        self,
        condition: Callable[[Any], bool],
        body: Any,
        *,
        max_iterations: int = 100,
        name: str | None = None,
    ) -> Saga:
        """Run ``body``, then ``condition(ctx)``; repeat until it returns True."""
        return self._loop(LoopKind.UNTIL, condition, body, max_iterations, name)

    def do_while(
        self,
        condition: Callable[[Any], bool],
        body: Any,
        *,
        max_iterations: int = 100,
        name: str | None = None,
    ) -> Saga:
        """Run ``body`` as long as ``condition(ctx)``, checked before each iteration, is True."""
        return self._loop(LoopKind.WHILE, condition, body, max_iterations, name)

    def for_each(
        self,
        items: Callable[[Any], Any],
        body: Any,
        *,
        max_iterations: int = 1000,
        name: str | None = None,
    ) -> Saga:
        """Run the step ``body`` once per element of the list ``items(ctx)``, in order; each
        iteration gets ``ctx.item`` and ``ctx.iteration``."""
        specs = _as_steps(self.name, body)
        if len(specs) != 1:
            raise DefinitionError(f"saga {self.name!r}: for_each runs exactly one step")
        spec = specs[0]
        if not callable(items):
            raise DefinitionError(
                f"saga {self.name!r}: for_each {spec.name!r} needs a callable items(ctx) "
                f"returning a list, got {items!r}"
            )
        loop_name = name or spec.name
        validate_step(self.name, spec)
        check_max_iterations(self.name, loop_name, max_iterations)
        check_iteration_names(self.name, specs, max_iterations)
        return self._add(ForEachNode(loop_name, items, spec, max_iterations))

    def _loop(
        self,
        kind: LoopKind,
        condition: Callable[[Any], bool],
        body: Any,
        max_iterations: int,
        name: str | None,
    ) -> Saga:
        specs = _as_steps(self.name, body)
        loop_name = name or specs[0].name
        if not callable(condition):
            raise DefinitionError(
                f"saga {self.name!r}: {kind.value} {loop_name!r} needs a callable condition"
            )
        for spec in specs:
            validate_step(self.name, spec)
        check_max_iterations(self.name, loop_name, max_iterations)
        check_iteration_names(self.name, specs, max_iterations)
        return self._add(LoopNode(loop_name, kind, condition, specs, max_iterations))

    def seal(self) -> SagaDefinition:
        """Validate the whole graph and freeze it; idempotent."""
        if self._sealed is None:
            nodes = tuple(self._nodes)
            validate_saga(self.name, nodes)
            shape = structural_hash(self.name, nodes, self.version)
            marked = frozenset(s.name for node in nodes for s in node_steps(node) if s.sensitive)
            marks = replace(self.sensitive, steps=marked)
            self._sealed = SagaDefinition(
                self.name,
                nodes,
                shape,
                self.version,
                self.timeout,
                marks,
                self.on_failure,
                self.hold_timeout,
                self.concurrency,
            )
        return self._sealed


def run_timeout(what: str, timeout: float | timedelta | None) -> float | None:
    """A run's deadline in seconds (``timeout=``), checked: a positive number or None."""
    return positive_seconds(what, "timeout", timeout)


def _child_marker() -> None:
    """Stands in for a sub-saga's action when its record name is validated like a step's."""
