"""The failure points an exploration visits, and what each one injects: pure decisions.

A run that reached every node once (the baseline) lists its step records in start order
(``Site``) and the gates it passed (``Gate``). ``points_of`` turns them into the points to
explore, in a fixed order; ``injection`` says what a body does at a point (raise, send a
copy of its own message, be interrupted after it ran) and ``expected_end`` how the run
must end there. Nothing here does I/O, so the order and the verdicts are the same on every
machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from celery_saga.definition.nodes import split_iteration
from celery_saga.records import ExecutionState


class Fault(str, Enum):
    """What a point does to the run; the value starts the point's id."""

    NONE = "baseline"
    STEP_FAILS = "fail"
    REVERSAL_FAILS = "fail-reversal"
    WAIT_TIMES_OUT = "timeout"
    WAIT_SIGNALLED = "signal"
    CANCEL_AT_GATE = "cancel"
    DUPLICATE = "duplicate"
    DUPLICATE_REVERSAL = "duplicate-reversal"
    INTERRUPT = "interrupt"
    INTERRUPT_REVERSAL = "interrupt-reversal"


#: The faults that act on a reversal, once an unwind reaches it.
REVERSAL_FAULTS = (Fault.REVERSAL_FAILS, Fault.DUPLICATE_REVERSAL, Fault.INTERRUPT_REVERSAL)


class Injection(str, Enum):
    """What one call of a body does at a point."""

    RUN = "run"  # the body runs as it is
    RAISE = "raise"  # the body is not called: the attempt raises ``InjectedFailure``
    COPY = "copy"  # a copy of the body's own message is delivered first, then the body runs
    INTERRUPT = "interrupt"  # the body runs, then its attempt is cut short as by a crash


@dataclass(frozen=True)
class Site:
    """One step record of the baseline run: where a step's faults are injected."""

    name: str
    node: int
    retry: int
    compensatable: bool


@dataclass(frozen=True)
class Gate:
    """A ``wait_for`` gate the baseline run passed."""

    event: str
    node: int
    timeout: float | None = None


@dataclass(frozen=True)
class Point:
    """One failure point. ``target`` is a step record or a gate's event; ``failures`` the
    attempts of a failing step that raise (its ``retry``: it fails for good); ``trigger``
    the step record whose failure starts the unwind a reversal fault needs; ``paths`` the
    branch paths the run is sent down (none: the ones its selectors choose)."""

    fault: Fault
    target: str = ""
    failures: int = 0
    retry: int = 1
    trigger: str | None = None
    paths: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """What ``explore(..., only=)`` takes to explore this point alone."""
        where = "".join(f"[{branch}={chosen}] " for branch, chosen in self.paths)
        if self.fault is Fault.NONE:
            return f"{where}{self.fault.value}"
        attempts = f"@{self.failures}" if self.fault is Fault.STEP_FAILS else ""
        if self.failures == self.retry:
            attempts = ""
        return f"{where}{self.fault.value}:{self.target}{attempts}"


@dataclass(frozen=True)
class Expected:
    """How a run must end at a point: its state, whether what it did is unwound, and the
    reversal a parked unwind must name (then a resume must finish it)."""

    state: ExecutionState
    unwound: bool
    parks_on: str | None = None


def chosen_iterations(sites: Sequence[Site]) -> list[Site]:
    """Every site, but of each loop body step only the first, a middle and the last
    iteration."""
    counts: dict[str, int] = {}
    for site in sites:
        base, index = split_iteration(site.name)
        if index is not None:
            counts[base] = counts.get(base, 0) + 1
    kept = []
    for site in sites:
        base, index = split_iteration(site.name)
        if index is None or index in {0, counts[base] // 2, counts[base] - 1}:
            kept.append(site)
    return kept


def _before_pivot(node: int, pivot: int | None) -> bool:
    return pivot is None or node < pivot


def _trigger(site: Site, sites: Sequence[Site], pivot: int | None) -> str:
    """The step whose failure unwinds ``site``: the last one before the pivot, so that the
    unwind meets every completed step's reversal with its step's result (a failed step's
    own reversal is its ``fail:`` point's)."""
    later = [s for s in sites[sites.index(site) + 1 :] if _before_pivot(s.node, pivot)]
    return later[-1].name if later else site.name


def _site_points(site: Site, sites: Sequence[Site], pivot: int | None) -> list[Point]:
    points = [
        Point(Fault.STEP_FAILS, site.name, failures, site.retry)
        for failures in range(1, site.retry + 1)
    ]
    points += [Point(Fault.DUPLICATE, site.name), Point(Fault.INTERRUPT, site.name)]
    if site.compensatable and _before_pivot(site.node, pivot):
        trigger = _trigger(site, sites, pivot)
        points += [Point(fault, site.name, trigger=trigger) for fault in REVERSAL_FAULTS]
    return points


def _gate_points(gate: Gate, pivot: int | None) -> list[Point]:
    points = [Point(Fault.WAIT_SIGNALLED, gate.event)]
    if gate.timeout is not None:
        points.append(Point(Fault.WAIT_TIMES_OUT, gate.event))
    if _before_pivot(gate.node, pivot):  # a run past its pivot cannot be cancelled
        points.append(Point(Fault.CANCEL_AT_GATE, gate.event))
    return points


def points_of(
    sites: Sequence[Site],
    gates: Sequence[Gate],
    pivot: int | None,
    paths: tuple[tuple[str, str], ...] = (),
    only_sites: frozenset[str] | None = None,
) -> list[Point]:
    """The points of one baseline, in the order the run meets them (``only_sites``: those
    of these step records alone, for a branch path's own exploration)."""
    kept = chosen_iterations(sites)
    points: list[Point] = [] if only_sites is not None else [Point(Fault.NONE)]
    waiting = sorted(gates, key=lambda gate: gate.node)
    for site in kept:
        while waiting and waiting[0].node < site.node and only_sites is None:
            points += _gate_points(waiting.pop(0), pivot)
        if only_sites is None or site.name in only_sites:
            points += _site_points(site, kept, pivot)
    if only_sites is None:
        for gate in waiting:
            points += _gate_points(gate, pivot)
    return [Point(p.fault, p.target, p.failures, p.retry, p.trigger, paths) for p in points]


def injection(point: Point | None, record: str, reversal: bool, call: int) -> Injection:
    """What the ``call``-th call (1-based) of ``record``'s body does at ``point``
    (``reversal``: its compensation's body)."""
    if point is None or point.fault is Fault.NONE:
        return Injection.RUN
    fault, target = point.fault, point.target
    if not reversal:
        if fault is Fault.STEP_FAILS and record == target and call <= point.failures:
            return Injection.RAISE
        if fault in REVERSAL_FAULTS and record == point.trigger:
            return Injection.RAISE
        if record == target and call == 1:
            return _first_call(fault, Fault.DUPLICATE, Fault.INTERRUPT)
        return Injection.RUN
    if record != target:
        return Injection.RUN
    if fault is Fault.REVERSAL_FAILS:
        return Injection.RAISE
    return (
        _first_call(fault, Fault.DUPLICATE_REVERSAL, Fault.INTERRUPT_REVERSAL)
        if call == 1
        else Injection.RUN
    )


def _first_call(fault: Fault, duplicate: Fault, interrupt: Fault) -> Injection:
    if fault is duplicate:
        return Injection.COPY
    return Injection.INTERRUPT if fault is interrupt else Injection.RUN


def expected_end(
    point: Point, sites: Sequence[Site], gates: Sequence[Gate], pivot: int | None
) -> Expected:
    """How the run must end at ``point``, as ``docs/guarantees.md`` documents it."""
    nodes = {site.name: site.node for site in sites} | {gate.event: gate.node for gate in gates}
    fault = point.fault
    if fault is Fault.STEP_FAILS and point.failures >= point.retry:
        return Expected(ExecutionState.FAILED, _before_pivot(nodes[point.target], pivot))
    if fault is Fault.WAIT_TIMES_OUT:
        return Expected(ExecutionState.FAILED, _before_pivot(nodes[point.target], pivot))
    if fault is Fault.CANCEL_AT_GATE:
        return Expected(ExecutionState.CANCELLED, True)
    if fault in REVERSAL_FAULTS:
        parks_on = point.target if fault is Fault.REVERSAL_FAILS else None
        return Expected(ExecutionState.FAILED, True, parks_on)
    return Expected(ExecutionState.COMPLETED, False)
