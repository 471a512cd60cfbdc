"""``explore``: run a saga once per failure point on the embedded default and check, from the
stored run and its history, that it behaves as ``docs/guarantees.md`` says at each.

A baseline run (every gate answered) lists the step records and gates the saga reaches;
``points.points_of`` turns them into failure points, in a fixed order. Each point is a run
of its own, driven here: its gates are answered, timed out or cancelled as the point says, a
parked unwind is resumed once its failing reversal is allowed to succeed, and the messages
the point copied are delivered once more after the run settled. Runs whose point moves the
clock run one at a time, after the others (the clock is the process's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery_saga.definition.builder import Saga, SagaDefinition
from celery_saga.definition.nodes import BranchNode, PivotNode, WaitNode, node_steps
from celery_saga.records import Execution, ExecutionState
from celery_saga.store import history
from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.invariants import Observed, problems
from celery_saga.testing.kit import Timeline, timeline_of
from celery_saga.testing.points import (
    Expected,
    Fault,
    Gate,
    Point,
    Site,
    expected_end,
    points_of,
)
from celery_saga.testing.report import ExplorationReport, PointFailure
from celery_saga.testing.sandbox import Sandbox, sandbox
from celery_saga.worker.engine import SagaEngine

#: ``on_point(point, timeline)``: the caller's own assertions at each point.
OnPoint = Callable[[Point, Timeline], None]

#: The engine and clock of a ``SagaKit`` exploring on its own worker (``explore_on``): Celery
#: stops every embedded worker of a process when one stops, so a kit's test cannot start
#: and stop a second one.
_borrowed: ContextVar[tuple[SagaEngine, ControlledClock] | None] = ContextVar(
    "borrowed", default=None
)

#: Seconds between two reads of a run its driver waits for.
WAIT_POLL = 0.05

#: Times a run's driver acts on it (a gate answered, a resume) before giving up.
MOVES = 50


@dataclass(frozen=True)
class _Baseline:
    """What one baseline run reached: its step records and gates, and the pivot's node."""

    point: Point
    sites: tuple[Site, ...]
    gates: tuple[Gate, ...]
    pivot: int | None


@dataclass(frozen=True)
class _Options:
    input: Any
    signals: Mapping[str, Any]
    on_point: OnPoint | None
    effect_free: frozenset[str]
    timeout: float


def explore(
    saga: Saga,
    input: Any = None,
    *,
    sagas: Iterable[Saga] = (),
    signals: Mapping[str, Any] | None = None,
    only: str | None = None,
    max_points: int | None = None,
    on_point: OnPoint | None = None,
    fakes: Mapping[str, Any] | None = None,
    pure: Iterable[str] = (),
    concurrency: int = 4,
    timeout: float = 30.0,
) -> ExplorationReport:
    """Fail ``saga`` at every point and return what broke where.

    ``input`` is each run's input; ``sagas`` the sagas it runs as sub-sagas; ``signals``
    the payload each gate is answered with (by event); ``only`` explores one point by its
    id (a failure's reproduction); ``max_points`` caps the points explored, in order;
    ``on_point(point, timeline)`` adds the caller's assertions at each point; ``fakes``
    replaces steps' bodies by name; ``pure`` names steps without a compensation whose
    effect needs none (a read). ``concurrency`` runs that many points at once; ``timeout``
    is the seconds each run may take to settle.
    """
    children = tuple(sagas)
    _check(saga, children, only, max_points, on_point, concurrency)
    started = time.monotonic()
    fakes = dict(fakes or {})
    quiet = only is None
    with sandbox(saga, children, fakes, 2 * concurrency, _borrowed.get(), quiet) as box:
        options = _Options(input, dict(signals or {}), on_point, _effect_free(box, pure), timeout)
        baselines, seen = _baselines(box, options)
        every = [p for baseline in baselines for p in _points(box.definition, baseline)]
        points = _chosen(every, only, max_points)
        left_out = 0 if only is not None else len(every) - len(points)
        verdicts = _explore_all(box, options, baselines, points, seen, concurrency)
    failures = tuple(
        PointFailure(point, tuple(found), f"explore({saga.name}, input, only={point.id!r})")
        for point, found in zip(points, verdicts, strict=True)
        if found
    )
    return ExplorationReport(
        saga.name, tuple(points), failures, left_out, time.monotonic() - started
    )


def explore_on(
    engine: SagaEngine, clock: ControlledClock, saga: Saga, input: Any = None, **options: Any
) -> ExplorationReport:
    """``explore`` on ``engine``, whose worker runs already, with ``clock`` installed."""
    token = _borrowed.set((engine, clock))
    try:
        return explore(saga, input, **options)
    finally:
        _borrowed.reset(token)


def _check(
    saga: Any, sagas: Iterable[Any], only: Any, max_points: Any, on_point: Any, concurrency: Any
) -> None:
    if not isinstance(saga, Saga):
        raise TypeError(f"explore() takes a Saga built with Saga(...), got {saga!r:.80}")
    for child in sagas:
        if not isinstance(child, Saga):
            raise TypeError(f"explore(sagas=) takes Saga builders, got {child!r:.80}")
    if only is not None and not isinstance(only, str):
        raise TypeError(f"only= takes a point's id (e.g. 'fail:charge'), got {only!r:.80}")
    if max_points is not None and (
        isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1
    ):
        raise ValueError(f"max_points= takes a positive number of points, got {max_points!r}")
    if on_point is not None and not callable(on_point):
        raise TypeError(f"on_point= takes a callable (point, timeline), got {on_point!r:.80}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency= takes a positive number, got {concurrency!r}")


def _effect_free(box: Sandbox, pure: Iterable[str]) -> frozenset[str]:
    transforms = {
        spec.name for node in box.definition.nodes for spec in node_steps(node) if spec.is_transform
    }
    return frozenset(transforms) | frozenset(pure)


def _chosen(points: list[Point], only: str | None, max_points: int | None) -> list[Point]:
    if only is not None:
        chosen = [p for p in points if p.id == only]
        if not chosen:
            known = ", ".join(p.id for p in points)
            raise ValueError(f"no point {only!r} in this saga's exploration; its points: {known}")
        return chosen
    return points[:max_points] if max_points is not None else points


# -- baselines --------------------------------------------------------------------------
def _baselines(box: Sandbox, options: _Options) -> tuple[list[_Baseline], dict[Point, Observed]]:
    """The default baseline, then one per branch path its selectors did not choose."""
    first = Point(Fault.NONE)
    seen = {first: _drive(box, first, options)}
    baselines = [_baseline(box.definition, first, seen[first].execution)]
    taken = {s.name for s in baselines[0].sites}
    for node in box.definition.nodes:
        if not isinstance(node, BranchNode):
            continue
        for name, steps in node.paths.items():
            if steps and all(s.name in taken for s in steps):
                continue  # the path the default baseline took
            point = Point(Fault.NONE, paths=((node.name, name),))
            seen[point] = _drive(box, point, options)
            baselines.append(_baseline(box.definition, point, seen[point].execution))
    return baselines, seen


def _baseline(definition: SagaDefinition, point: Point, execution: Execution) -> _Baseline:
    sites = []
    for record in sorted(execution.steps, key=lambda r: r.id):
        spec = definition.find_step(record.name)
        if spec is None or spec.is_transform or record.child_execution_id is not None:
            continue
        sites.append(Site(record.name, record.node, spec.retry, spec.compensatable))
    reached = len(definition.nodes)
    if execution.state is not ExecutionState.COMPLETED:
        reached = execution.record.cursor
    gates: list[Gate] = []
    pivots: list[int] = []
    for index, node in enumerate(definition.nodes):
        match node:
            case WaitNode() if index < reached:
                gates.append(Gate(node.event, index, node.timeout))
            case PivotNode():
                pivots.append(index)
            case _:
                pass
    return _Baseline(point, tuple(sites), tuple(gates), pivots[0] if pivots else None)


def _points(definition: SagaDefinition, baseline: _Baseline) -> list[Point]:
    if not baseline.point.paths:
        return points_of(baseline.sites, baseline.gates, baseline.pivot)
    ((branch, chosen),) = baseline.point.paths
    node = next(n for n in definition.nodes if isinstance(n, BranchNode) and n.name == branch)
    names = frozenset(s.name for s in node.paths[chosen])
    own = frozenset(s.name for s in baseline.sites if s.name.split(":")[0] in names)
    rest = points_of(baseline.sites, baseline.gates, baseline.pivot, baseline.point.paths, own)
    return [baseline.point, *rest]


# -- the points -------------------------------------------------------------------------
def _explore_all(
    box: Sandbox,
    options: _Options,
    baselines: list[_Baseline],
    points: list[Point],
    seen: dict[Point, Observed],
    concurrency: int,
) -> list[list[str]]:
    """Each point's problems, in the order of ``points``."""
    by_plan = {b.point.paths: b for b in baselines}
    todo = [p for p in points if p not in seen]
    moves_clock = [p for p in todo if p.fault is Fault.WAIT_TIMES_OUT]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        free = [p for p in todo if p.fault is not Fault.WAIT_TIMES_OUT]
        observed = pool.map(lambda p: _drive(box, p, options), free)
        seen.update(zip(free, observed, strict=True))
    for point in moves_clock:
        seen[point] = _drive(box, point, options)
    verdicts = []
    for point in points:
        baseline = by_plan[point.paths]
        expected = expected_end(point, baseline.sites, baseline.gates, baseline.pivot)
        verdicts.append(_verdict(box, point, expected, seen[point], options))
    return verdicts


def _verdict(
    box: Sandbox, point: Point, expected: Expected, seen: Observed, options: _Options
) -> list[str]:
    found = problems(point, expected, seen, options.effect_free)
    if options.on_point is not None:
        try:
            options.on_point(point, timeline_of(box.engine, seen.execution.id))
        except Exception as error:  # the caller's assertion is a finding, not a crash
            found.append(f"on_point: {type(error).__name__}: {error}")
    return found


def _drive(box: Sandbox, point: Point, options: _Options) -> Observed:
    """Run ``point`` to its end (answering gates, resuming a parked unwind once), deliver
    its copied messages once more, and read what it left."""
    engine, run = box.engine, f"explore-{uuid.uuid4().hex}"
    box.injector.assign(run, point)
    handle = engine.start(box.definition.name, options.input, execution_id=run)
    if point.fault is Fault.WAIT_SIGNALLED:  # the signal is there before the gate is
        engine.signal(run, point.target, options.signals.get(point.target))
    parked = None
    for _ in range(MOVES):
        try:
            execution = handle.wait(options.timeout, interval=WAIT_POLL)
        except TimeoutError:  # RunNotSettledError: the end state check names where it stood
            break
        if execution.state is ExecutionState.WAITING:
            if not _at_gate(box, point, execution, options):
                break
        elif (
            execution.state is ExecutionState.COMPENSATION_STUCK
            and parked is None
            and (point.fault is Fault.REVERSAL_FAILS)
        ):
            parked = execution.record.rollback_reason or execution.record.failure_reason or ""
            box.injector.disarm(run)
            engine.resume_compensation(run, actor="explore")
        else:
            break
    for task_name, task_id, header in box.injector.copies(run):
        box.injector.deliver_copy(run, task_name, task_id, header)
    return _observed(box, run, parked)


def _at_gate(box: Sandbox, point: Point, execution: Execution, options: _Options) -> bool:
    """Answer, time out or cancel the gate the run waits at; False: it waits at none."""
    engine, run = box.engine, execution.id
    nodes = box.definition.nodes
    cursor = execution.record.cursor
    node = nodes[cursor] if cursor < len(nodes) else None
    if not isinstance(node, WaitNode):
        return False
    if point.target == node.event and point.fault is Fault.CANCEL_AT_GATE:
        engine.cancel(run, f"explored point {point.id}", actor="explore")
    elif point.target == node.event and point.fault is Fault.WAIT_TIMES_OUT:
        box.clock.advance((node.timeout or 0) + 1)
        engine.fire_timers()
    else:
        engine.signal(run, node.event, options.signals.get(node.event))
    return True


def _observed(box: Sandbox, run: str, parked: str | None) -> Observed:
    engine = box.engine
    execution = engine.get(run)
    children = {
        record.name: (engine.get(child), history.load(engine.db, child))
        for record in execution.steps
        if (child := record.child_execution_id) is not None
    }
    return Observed(
        execution,
        history.load(engine.db, run),
        box.injector.completed(run),
        parked,
        children,
    )
