"""The invariants of ``docs/guarantees.md`` checked on one explored run: pure functions of
the stored run, its history and the bodies the explorer saw run to their end.

Each check returns the problems it found, as sentences naming the step records involved;
none means the run behaved as documented at its point.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from celery_saga.definition.nodes import split_iteration
from celery_saga.records import (
    CompensationOutcome,
    Execution,
    ExecutionState,
    RollbackStatus,
    StepStatus,
)
from celery_saga.store.history import HistoryEntry, Kind
from celery_saga.testing.points import Expected, Fault, Point


@dataclass(frozen=True)
class Observed:
    """What the explorer read and saw of one run at its point."""

    execution: Execution
    history: Sequence[HistoryEntry]
    #: Bodies that ran to their end, per (step record, is reversal).
    completed: Mapping[tuple[str, bool], int]
    #: The reason the run parked with, if it parked at a reversal the point failed.
    parked: str | None = None
    #: Each sub-saga run, with its history, by its record name in this run.
    children: Mapping[str, tuple[Execution, Sequence[HistoryEntry]]] = field(default_factory=dict)


def problems(
    point: Point, expected: Expected, seen: Observed, effect_free: frozenset[str]
) -> list[str]:
    """Every invariant ``seen`` breaks at ``point`` (``effect_free``: step names that need
    no compensation: transforms, sub-sagas and the steps the caller declared pure)."""
    found = _end_state(expected, seen)
    found += _unwind(expected, seen.execution, seen.history, effect_free)
    found += _never_twice(point, seen)
    for name, (child, history) in seen.children.items():
        if any(s.compensation_status is not None for s in child.steps):
            found += [f"sub-saga {name!r}: {p}" for p in _reversed_once(child, history)]
    return found


def _end_state(expected: Expected, seen: Observed) -> list[str]:
    record = seen.execution.record
    found = []
    if record.state is not expected.state:
        why = record.rollback_reason or record.failure_reason
        because = f" ({why})" if why else ""
        found.append(f"the run ended {record.state.value}{because}, not {expected.state.value}")
    if expected.parks_on is not None:
        if seen.parked is None:
            found.append(f"the failed reversal of {expected.parks_on!r} did not park the run")
        elif repr(expected.parks_on) not in seen.parked and expected.parks_on not in seen.parked:
            found.append(f"the run parked without naming {expected.parks_on!r}: {seen.parked}")
    return found


def _unwind(
    expected: Expected,
    execution: Execution,
    history: Sequence[HistoryEntry],
    effect_free: frozenset[str],
) -> list[str]:
    record = execution.record
    reversed_steps = [s.name for s in execution.steps if s.compensation_status is not None]
    if record.committed_at is not None:
        found = [f"{name!r} was reversed past the pivot" for name in reversed_steps]
        if record.state is ExecutionState.FAILED and (
            record.rollback_status is not RollbackStatus.NOT_APPLICABLE
        ):
            found.append("a run that failed past its pivot must roll back not_applicable")
        return found
    if not expected.unwound or record.state not in (
        ExecutionState.FAILED,
        ExecutionState.CANCELLED,
    ):
        if record.state is ExecutionState.COMPLETED and reversed_steps:
            return [f"{name!r} was reversed in a run that completed" for name in reversed_steps]
        return []
    return _reversed_once(execution, history) + _left_in_place(execution, effect_free)


def _reversed_once(execution: Execution, history: Sequence[HistoryEntry]) -> list[str]:
    """Every step with a compensation reversed exactly once, in reverse start order."""
    record = execution.record
    if record.rollback_status is RollbackStatus.NOT_APPLICABLE and record.committed_at:
        return []
    eligible = [s for s in execution.steps if s.compensatable]
    found = [
        f"{s.name!r} ({s.status.value}) was not reversed: "
        f"{s.compensation_status.value if s.compensation_status else 'no outcome'}"
        for s in eligible
        if s.compensation_status is not CompensationOutcome.COMPENSATED
    ]
    done = [e.step for e in history if e.kind == Kind.REVERSAL_COMPLETED.value]
    found += [
        f"{n!r} was reversed {count} times" for n, count in Counter(done).items() if count > 1
    ]
    order = [s.name for s in sorted(eligible, key=lambda s: -s.id)]
    if not found and done != order:
        found.append(f"reversals ran in the order {done}, not reverse start order {order}")
    if eligible and not found and record.rollback_status is not RollbackStatus.COMPLETED:
        status = record.rollback_status.value if record.rollback_status else "none"
        found.append(f"every step was reversed but rollback_status is {status}")
    return found


def _left_in_place(execution: Execution, effect_free: frozenset[str]) -> list[str]:
    """A completed step with no compensation, before the pivot of a run that unwound: its
    effect stays while the run reports a clean rollback."""
    return [
        f"{s.name!r} completed and has no compensation, so the unwind left its effect in "
        "place: give it a compensation, or place pivot() right after it"
        for s in execution.steps
        if s.status is StepStatus.COMPLETED
        and not s.compensatable
        and s.child_execution_id is None
        and split_iteration(s.name)[0] not in effect_free
    ]


def _never_twice(point: Point, seen: Observed) -> list[str]:
    """No step completes twice in the store (a reversal: ``_reversed_once``), and no body
    runs to its end twice but the one the point interrupted after it ran (it runs again,
    under the same key)."""
    rows = Counter(e.step for e in seen.history if e.kind == Kind.STEP_COMPLETED.value)
    found = [f"{step!r} completed {n} times" for step, n in rows.items() if n > 1]
    for (record, reversal), count in seen.completed.items():
        fault = Fault.INTERRUPT_REVERSAL if reversal else Fault.INTERRUPT
        allowed = 2 if point.fault is fault and point.target == record else 1
        if count > allowed:
            body = "compensation" if reversal else "body"
            found.append(f"the {body} of {record!r} ran to its end {count} times")
    return found
