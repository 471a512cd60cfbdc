"""Calling a step or compensation: argument mapping, schemas and timeouts."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import SchemaValidationError
from celery_saga.runtime.async_bodies import run_body
from celery_saga.runtime.describe import describe_error
from celery_saga.runtime.saga_context import SagaContext

# Also read through this module by the step and reversal runners and the worker.
from celery_saga.runtime.task_body import RunningBody as RunningBody
from celery_saga.runtime.task_body import body_error as body_error
from celery_saga.runtime.task_body import body_of as body_of
from celery_saga.runtime.task_body import running_body as running_body

_CONTEXT_NAMES = ("ctx", "context")


def _body(target: Any) -> Callable[..., Any]:
    """The function whose signature describes a Celery task (``run``) or a callable."""
    run = getattr(target, "run", None)
    return run if callable(run) and hasattr(target, "apply_async") else target  # type: ignore[no-any-return]


def _parameters(target: Any) -> Mapping[str, inspect.Parameter]:
    """The parameters of a step's action or compensation, inspected once per target (a
    registered step keeps its target for the life of the process)."""
    try:
        return _cached_parameters(target)
    except TypeError:  # an unhashable callable object
        return _inspect_parameters(target)


@functools.lru_cache(maxsize=4096)
def _cached_parameters(target: Any) -> Mapping[str, inspect.Parameter]:
    return _inspect_parameters(target)


def _inspect_parameters(target: Any) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(_body(target)).parameters
    except (TypeError, ValueError):
        return {}


def _asks_for_context(parameters: Mapping[str, inspect.Parameter]) -> str | None:
    for name, parameter in parameters.items():
        if name in _CONTEXT_NAMES or parameter.annotation in (SagaContext, "SagaContext"):
            return name
    return None


def needs_context(spec: StepSpec) -> bool:
    """Whether calling ``spec`` needs the saga input or earlier results (a stored read):
    a mapper, a transform, an input schema, or an action that takes any parameter."""
    if spec.args is not None or spec.is_transform or spec.input_schema is not None:
        return True
    return bool(_parameters(spec.action))


def needs_results(spec: StepSpec) -> bool:
    """Whether calling ``spec`` may read earlier results or signals, which are read with
    every step record of the run: a mapper, a transform, or an action that takes the
    context. Otherwise it is given input keys (and a loop's ``item`` and ``iteration``)."""
    if spec.args is not None or spec.is_transform:
        return True
    return _asks_for_context(_parameters(spec.action)) is not None


def reversal_needs_run(spec: StepSpec) -> bool:
    """Whether calling ``spec``'s compensation needs the saga input or results (a stored
    read): a mapper, or a compensation that takes anything but its step's ``result``."""
    if spec.compensation_args is not None:
        return True
    parameters = _parameters(spec.compensation)
    return any(
        name != "result" or parameter.kind is inspect.Parameter.VAR_KEYWORD
        for name, parameter in parameters.items()
    )


def as_plain_mapping(value: Any) -> Mapping[str, Any]:
    """A validated model's fields, or the mapping itself; anything else maps to nothing."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump()  # type: ignore[no-any-return]
    return value if isinstance(value, Mapping) else {}


def call_arguments(
    target: Any,
    ctx: SagaContext,
    mapper: Callable[[SagaContext], Mapping[str, Any]] | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``target``: the mapper's, the context, or the input keys (plus
    ``ctx.extra``, e.g. a loop's ``iteration`` and ``item``, and ``extra``) it accepts."""
    if mapper is not None:
        mapped = mapper(ctx)
        if not isinstance(mapped, Mapping):
            raise TypeError(
                f"args mapper of step {ctx.step_name!r} returned "
                f"{type(mapped).__name__}, not a mapping"
            )
        return dict(mapped)
    parameters = _parameters(target)
    context_name = _asks_for_context(parameters)
    if context_name is not None:
        return {context_name: ctx}
    available = {**as_plain_mapping(ctx.input), **ctx.extra, **(extra or {})}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return available
    return {name: value for name, value in available.items() if name in parameters}


def apply_schema(schema: Any, value: Any, what: str) -> Any:
    """Validate ``value`` and return what the validator RETURNS (coercions, defaults).

    Accepts a pydantic model or TypeAdapter, any object with ``model_validate``,
    ``validate_python``, ``load`` (marshmallow), ``parse`` or ``validate``, or a plain
    callable. A validator that
    returns None only asserts, and the original value is kept.
    """
    if schema is None:
        return value
    for method in ("model_validate", "validate_python", "load", "parse", "validate"):
        validator = getattr(schema, method, None)
        if callable(validator):
            break
    else:
        validator = schema
    try:
        validated = validator(value)
    except Exception as error:
        raise SchemaValidationError(
            f"{what} was rejected by its schema: {describe_error(error)}"
        ) from error
    return value if validated is None else validated


def storable(value: Any) -> Any:
    """A validated model is stored as its fields."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="python") if callable(dump) else value


def invoke_step(saga_name: str, spec: StepSpec, ctx: SagaContext) -> Any:
    """Schemas, arguments, timeout: call the step and return its storable result."""
    what = f"step {spec.name!r} of saga {saga_name!r}"
    ctx = replace(ctx, input=apply_schema(spec.input_schema, ctx.input, f"input of {what}"))
    if spec.is_transform:
        value = spec.action(ctx)
    else:
        kwargs = call_arguments(spec.action, ctx, spec.args)
        call = body_of(spec.action)
        value = run_body(spec.action, lambda: call(kwargs), spec.timeout, what)
    return storable(apply_schema(spec.output_schema, value, f"output of {what}"))
