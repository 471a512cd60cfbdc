"""The copy of a saga an exploration registers: the same graph, built with the public
builder, whose step and compensation bodies go through the ``Injector``.

Each step keeps its name, retries, timeouts and schemas; its body and compensation are the
user's own functions (or the ``fakes`` given for them), called with the arguments the
engine would give them. Two things differ, both for speed and determinism: retries and
reversals wait no backoff, and each branch takes the path the point names (else the one its
selector chooses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, assert_never

from celery_saga.definition.builder import Saga, SagaDefinition, path
from celery_saga.definition.nodes import (
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
)
from celery_saga.testing.injection import Injector

#: The pause between attempts in the copy (the builder refuses zero).
NO_BACKOFF = 0.001


def explored_saga(definition: SagaDefinition, injector: Injector, fakes: Mapping[str, Any]) -> Saga:
    """A new ``Saga`` with ``definition``'s name and graph, its bodies wrapped."""
    marks = definition.sensitive
    sensitive = marks.predicate or (tuple(marks.keys) or None)
    copy = Saga(
        definition.name, version=definition.label, timeout=definition.timeout, sensitive=sensitive
    )
    for node in definition.nodes:
        _add(copy, node, injector, fakes)
    return copy


def _spec(spec: StepSpec, injector: Injector, fakes: Mapping[str, Any]) -> StepSpec:
    if spec.is_transform:
        return spec  # a pure transform: nothing to fail, copy or reverse
    action = fakes.get(spec.name, spec.action)
    compensation = spec.compensation
    if compensation is not None:
        compensation = injector.reversal(compensation, spec.compensation_args)
    return replace(
        spec,
        action=injector.forward(action, spec.args),
        compensation=compensation,
        args=None,
        compensation_args=None,
        backoff=NO_BACKOFF,
        backoff_max=NO_BACKOFF,
    )


def _selector(node: BranchNode, injector: Injector) -> Callable[[Any], str]:
    def choose(ctx: Any) -> str:
        forced = injector.path(ctx.execution_id, node.name)
        return forced if forced is not None else node.selector(ctx)

    return choose


def _add(copy: Saga, node: Node, injector: Injector, fakes: Mapping[str, Any]) -> None:
    def spec(s: StepSpec) -> StepSpec:
        return _spec(s, injector, fakes)

    match node:
        case StepNode(step):
            copy.step(spec(step))
        case ParallelNode(name, steps):
            copy.parallel(name, *map(spec, steps))
        case BranchNode(name, _, paths):
            chosen = [path(p, *map(spec, steps)) for p, steps in paths.items()]
            copy.branch(name, _selector(node, injector), *chosen)
        case PivotNode():
            copy.pivot()
        case WaitNode(event, timeout):
            copy.wait_for(event, timeout=timeout)
        case SubSagaNode(name, saga, mapper):
            copy.sub_saga(saga, input=mapper, name=name)
        case LoopNode(name, kind, condition, steps, limit):
            loop = copy.do_until if kind is LoopKind.UNTIL else copy.do_while
            loop(condition, [spec(s) for s in steps], max_iterations=limit, name=name)
        case ForEachNode(name, items, step, limit):
            copy.for_each(items, spec(step), max_iterations=limit, name=name)
        case _:
            assert_never(node)
