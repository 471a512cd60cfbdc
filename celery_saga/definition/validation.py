"""Checks run when a saga is built or sealed; each error names the saga and the step."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery_saga.definition.nodes import (
    BranchNode,
    ForEachNode,
    LoopNode,
    Node,
    ParallelNode,
    PivotNode,
    StepSpec,
    SubSagaNode,
    WaitNode,
    iteration_name,
    node_steps,
)
from celery_saga.definition.sensitivity import check_step_sensitive
from celery_saga.errors import DefinitionError
from celery_saga.limits import NAME_LENGTH, text_problem

#: ``name:<digits>`` is how loop iterations are recorded, so a step may not be named that way.
_ITERATION_SUFFIX = re.compile(r":\d+$")
RESERVED_STEP_NAMES = frozenset({"input", "results", "signals"})
#: Longer waits belong to ``wait_for``; past this a thread join overflows.
MAX_SECONDS = 366 * 24 * 3600


def shown(name: str) -> str:
    """A name for an error message, cut short when it is too long to read."""
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}..."


def check_stored_name(where: str, what: str, name: str, column: str) -> None:
    """Refuse a name its store column cannot hold (guarantee 29)."""
    problem = text_problem(name, NAME_LENGTH, column)
    if problem is not None:
        raise DefinitionError(f"{where}{what} {shown(name)} {problem}")


def check_iteration_names(saga: str, specs: Sequence[StepSpec], max_iterations: int) -> None:
    """A loop body step is recorded once per iteration as ``name:<index>``; the last
    index ``max_iterations`` allows must still fit ``saga_steps.name``."""
    for spec in specs:
        last = iteration_name(spec.name, max_iterations - 1)
        if len(last) > NAME_LENGTH:
            raise DefinitionError(
                f"saga {saga!r}: loop step {shown(spec.name)} is recorded per iteration as "
                f"'<name>:<index>', up to {len(last)} characters with "
                f"max_iterations={max_iterations}; saga_steps.name holds at most "
                f"{NAME_LENGTH}: shorten the name or lower max_iterations"
            )


def _check_positive(saga: str, step: str, field: str, value: float | None) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_SECONDS
    ):
        raise DefinitionError(
            f"saga {saga!r}, step {step!r}: {field} must be a positive number of seconds "
            f"(at most {MAX_SECONDS}), got {value!r}"
        )


def wait_seconds(saga: str, event: str, timeout: float | timedelta | None) -> float | None:
    """A wait's deadline in seconds: positive and finite; weeks are fine (it is a row)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise DefinitionError(
            f"saga {saga!r}: the timeout of wait_for({event!r}) must be a positive number of "
            f"seconds or a timedelta, got {timeout!r}"
        )
    return float(seconds)


def check_max_iterations(saga: str, loop: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DefinitionError(
            f"saga {saga!r}, loop {loop!r}: max_iterations must be an integer >= 1, got {value!r}"
        )


def _check_attempts(saga: str, step: str, field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DefinitionError(
            f"saga {saga!r}, step {step!r}: {field} is a number of attempts and must be an "
            f"integer >= 1, got {value!r}"
        )


def validate_step(saga: str, spec: StepSpec) -> None:
    name = spec.name
    if not isinstance(name, str) or not name.strip():
        raise DefinitionError(f"saga {saga!r}: a step needs a non-empty string name, got {name!r}")
    check_stored_name(f"saga {saga!r}: ", "step name", name, "saga_steps.name")
    if name in RESERVED_STEP_NAMES or name.startswith("__"):
        raise DefinitionError(f"saga {saga!r}: step name {name!r} is reserved")
    if _ITERATION_SUFFIX.search(name):
        raise DefinitionError(
            f"saga {saga!r}: step name {name!r} ends in ':<number>', which is reserved for "
            "loop iterations"
        )
    if not callable(spec.action):
        raise DefinitionError(
            f"saga {saga!r}, step {name!r}: the action must be a Celery task or a callable, "
            f"got {spec.action!r}"
        )
    if spec.compensation is not None and not callable(spec.compensation):
        raise DefinitionError(
            f"saga {saga!r}, step {name!r}: the compensation must be a Celery task or a "
            f"callable, got {spec.compensation!r}"
        )
    check_step_sensitive(saga, name, spec.sensitive)
    _check_attempts(saga, name, "retry", spec.retry)
    _check_attempts(saga, name, "compensation_retry", spec.compensation_retry)
    _check_positive(saga, name, "timeout", spec.timeout)
    _check_positive(saga, name, "compensation_timeout", spec.compensation_timeout)
    _check_positive(saga, name, "backoff", spec.backoff)
    _check_positive(saga, name, "backoff_max", spec.backoff_max)
    for field in ("args", "compensation_args"):
        mapper = getattr(spec, field)
        if mapper is not None and not callable(mapper):
            raise DefinitionError(f"saga {saga!r}, step {name!r}: {field} must be callable")


def is_async_callable(target: Any) -> bool:
    """Whether calling ``target`` returns a coroutine: an ``async def`` function (a method
    or ``functools.partial`` of one too), or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(target):
        return True
    return callable(target) and inspect.iscoroutinefunction(type(target).__call__)


def _helpers(node: Node) -> list[tuple[str, Any]]:
    """The callables of ``node`` the engine calls in place for their value."""
    found: list[tuple[str, Any]] = []
    for spec in node_steps(node):
        if spec.is_transform:
            found.append((f"the transform of map {spec.name!r}", spec.action))
        found.append((f"the args= of step {spec.name!r}", spec.args))
        found.append((f"the compensation_args= of step {spec.name!r}", spec.compensation_args))
        found.append((f"the input_schema of step {spec.name!r}", spec.input_schema))
        found.append((f"the output_schema of step {spec.name!r}", spec.output_schema))
    match node:
        case BranchNode(name, selector):
            found.append((f"the selector of branch {name!r}", selector))
        case LoopNode(name, kind, condition):
            found.append((f"the condition of {kind.value} {name!r}", condition))
        case ForEachNode(name, items):
            found.append((f"the items of for_each {name!r}", items))
        case SubSagaNode(name, _, mapper):
            found.append((f"the input of sub-saga {name!r}", mapper))
        case _:
            pass  # a step, a group, a wait or the pivot calls nothing in place
    return found


def _refuse_async_helpers(saga: str, node: Node) -> None:
    """Only steps and compensations are awaited; a mapper, selector, condition or transform
    is called in place, and an async one would hand back a coroutine, not its value."""
    for what, helper in _helpers(node):
        if helper is not None and is_async_callable(helper):
            raise DefinitionError(
                f"saga {saga!r}: {what} is an async function; it is called in place for its "
                "value, which a coroutine is not: make it a plain def (steps and "
                "compensations may be async)"
            )


def _check_node(saga: str, node: Node) -> None:
    _refuse_async_helpers(saga, node)
    match node:
        case ParallelNode(name, ()):
            raise DefinitionError(f"saga {saga!r}: parallel group {name!r} has no steps")
        case BranchNode(name, selector, paths):
            if not callable(selector):
                raise DefinitionError(f"saga {saga!r}: branch {name!r} needs a callable selector")
            if not paths:
                raise DefinitionError(f"saga {saga!r}: branch {name!r} has no paths")
            for path_name, steps in paths.items():
                if not steps:
                    raise DefinitionError(
                        f"saga {saga!r}: path {path_name!r} of branch {name!r} has no steps"
                    )


def record_names(node: Node) -> tuple[str, ...]:
    """Names a node's records carry in ``saga_steps`` (before any iteration suffix)."""
    if isinstance(node, SubSagaNode):
        return (node.name,)
    return tuple(spec.name for spec in node_steps(node))


def _compared(name: str) -> str:
    """A name as MySQL/MariaDB's default collation compares it: ignoring case and trailing
    spaces. Two records whose names compare equal there would share one unique key."""
    return name.casefold().rstrip(" ")


def _seen_before(saga: str, what: str, name: str, seen: dict[str, str]) -> bool:
    """Whether ``name`` is in ``seen`` already; a name equal to it only once ``_compared``
    is refused here."""
    key = _compared(name)
    other = seen.get(key)
    if other is None:
        seen[key] = name
        return False
    if other != name:
        raise DefinitionError(
            f"saga {saga!r}: {what} {shown(other)} and {shown(name)} differ only in case or "
            "trailing spaces, which MySQL and MariaDB do not tell apart; rename one"
        )
    return True


def _check_pivots(saga: str, nodes: Sequence[Node]) -> None:
    pivots = sum(isinstance(node, PivotNode) for node in nodes)
    if pivots == len(nodes):
        raise DefinitionError(f"saga {saga!r} has no steps")
    if pivots > 1:
        raise DefinitionError(f"saga {saga!r} has more than one pivot")


def validate_saga(saga: str, nodes: Sequence[Node]) -> None:
    """Whole-graph checks: not empty, unique step names and events, at most one pivot."""
    _check_pivots(saga, nodes)
    seen: dict[str, str] = {}
    events: dict[str, str] = {}
    for node in nodes:
        _check_node(saga, node)
        for name in record_names(node):
            if _seen_before(saga, "step names", name, seen):
                raise DefinitionError(f"saga {saga!r}: step name {name!r} is used twice")
        if isinstance(node, WaitNode) and _seen_before(saga, "wait_for events", node.event, events):
            raise DefinitionError(
                f"saga {saga!r}: two wait_for gates wait for {node.event!r}; a signal "
                "could not tell them apart, so give each gate its own event"
            )
