"""What an operator's move on a run would do, decided before it is made (``engine.plan``,
``celery saga plan``, ``--dry-run``, the web view's confirmation pages). Pure.

A plan is the unwind's own rule (``decisions/unwind.next_unwind_step``) played forward on
the run's records as the move would leave them, every reversal assumed to succeed: so it
is what the engine then does, not a second copy of the rule. Each move is one entry of
``PLANNERS``: a function of the loaded run (and the step it names, if any) to a ``Plan``.
A move that changes the forward path (a held run's retry or skip) fills ``path`` with
``path_from``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from celery_saga.decisions.cancel import CancelVerdict, decide_cancel, interrupted_steps
from celery_saga.decisions.unwind import (
    SETTLED,
    UnwindKind,
    eligible_steps,
    next_unwind_step,
    outstanding_steps,
    parked_reversal,
)
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import PivotNode, node_name, node_steps, split_iteration
from celery_saga.definition.sensitivity import Sensitivity
from celery_saga.records import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    StepRecord,
    StepStatus,
)
from celery_saga.redaction import redact


@dataclass(frozen=True)
class LoadedRun:
    """A run as a plan reads it: its record, its step records, its own version's
    definition (None: not registered in this process) and its saga's markings."""

    record: ExecutionRecord
    steps: tuple[StepRecord, ...]
    definition: SagaDefinition | None
    marks: Sensitivity


@dataclass(frozen=True)
class PlannedReversal:
    """One reversal the move would run: ``result`` is the step's result its compensation
    receives (redacted where the saga marks it), ``forward_key`` the step's idempotency
    key (the compensation receives it too); ``step_status``: a failed step is reversed too."""

    step: str
    step_status: str
    forward_key: str
    result: Any = None


@dataclass(frozen=True)
class Plan:
    """What ``move`` would do to run ``execution_id``, now in ``state``.

    ``refused``: why the move would be refused (then nothing else applies). ``reversals``:
    in the order they would run. ``halts_at``: a step whose reversal would park the unwind
    (its compensation is not in the run's version). ``settled``: (step, outcome) of the
    reversals done before the first one it runs (a resolve's own among them).
    ``past_pivot``: steps never reversed because the run passed its pivot. ``skipped``:
    steps ``abandon`` would mark ``compensation_skipped``.
    ``path``: the nodes the run would run next (retry, skip). ``ends``: where it would end.
    ``input``: the saga input every compensation receives (redacted where marked).
    """

    execution_id: str
    saga: str
    move: str
    state: str
    refused: str | None = None
    reversals: tuple[PlannedReversal, ...] = ()
    halts_at: str | None = None
    settled: tuple[tuple[str, str], ...] = ()
    past_pivot: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    path: tuple[str, ...] = ()
    ends: str = ""
    input: Any = None
    step: str | None = None


def _compensations(run: LoadedRun) -> frozenset[str]:
    """The compensations the unwind may run: the version's own; without it, what the records
    say was declared (a vanished one cannot be told then)."""
    if run.definition is not None:
        return run.definition.reversible
    return frozenset(split_iteration(s.name)[0] for s in run.steps if s.compensatable)


def _base(
    run: LoadedRun, move: str, step: str | None = None, records: Sequence[StepRecord] = ()
) -> Plan:
    """The plan's facts about the run; ``records``: as the move leaves them (default:
    as they are)."""
    record = run.record
    past: tuple[str, ...] = ()
    if record.committed_at is not None:
        past = tuple(s.name for s in run.steps if s.status is not StepStatus.PENDING)
    return Plan(
        record.id,
        record.saga_name,
        move,
        record.state.value,
        past_pivot=past,
        input=redact(record.input, ("input",), run.marks),
        step=step,
        settled=tuple(
            (s.name, s.compensation_status.value)
            for s in eligible_steps(records or run.steps, record.committed_at is not None)
            if s.compensation_status in SETTLED
        ),
    )


def unwind_from(run: LoadedRun, records: Sequence[StepRecord], move: str) -> Plan:
    """The unwind played forward from ``records`` (the run's, as the move leaves them):
    each next reversal ``next_unwind_step`` names, assumed to succeed, until it is done or
    halts."""
    committed = run.record.committed_at is not None
    compensations = _compensations(run)
    current, planned = list(records), []
    decided = next_unwind_step(current, committed, compensations)
    while decided.kind is UnwindKind.COMPENSATE and decided.record is not None:
        done = decided.record
        planned.append(
            PlannedReversal(
                done.name,
                done.status.value,
                done.idempotency_key,
                redact(done.result, ("results", done.name), run.marks),
            )
        )
        settled = replace(done, compensation_status=CompensationOutcome.COMPENSATED)
        current = [settled if r.id == done.id else r for r in current]
        decided = next_unwind_step(current, committed, compensations)
    plan = replace(_base(run, move, records=records), reversals=tuple(planned))
    if decided.kind is UnwindKind.DONE:
        assert decided.rollback_status is not None
        return replace(plan, ends=f"failed, rollback {decided.rollback_status.value}")
    halted = decided.record.name if decided.record else None
    return replace(plan, halts_at=halted, ends=f"compensation_stuck at the reversal of {halted}")


def _not_parked(run: LoadedRun, move: str) -> Plan | None:
    if run.record.state is ExecutionState.COMPENSATION_STUCK:
        return None
    return replace(
        _base(run, move),
        refused=f"{move} needs a compensation_stuck run; it is {run.record.state.value}",
    )


def plan_unwind(run: LoadedRun, step: str | None = None) -> Plan:
    """An unwind from the records as they are (a held run's unwind, a compensating run's
    remaining reversals)."""
    return unwind_from(run, run.steps, "unwind")


def plan_cancel(run: LoadedRun, step: str | None = None) -> Plan:
    """A cancel: the steps it cuts short are recorded failed, then the run unwinds."""
    verdict = decide_cancel(run.record)
    if verdict is CancelVerdict.UNWINDING:
        return replace(unwind_from(run, run.steps, "cancel"), refused="already unwinding")
    if verdict is not CancelVerdict.CANCEL:
        return replace(_base(run, "cancel"), refused=verdict.value.replace("_", " "))
    cut = {s.id for s in interrupted_steps(run.steps)}
    records = [replace(s, status=StepStatus.FAILED) if s.id in cut else s for s in run.steps]
    plan = unwind_from(run, records, "cancel")
    return replace(plan, ends=plan.ends.replace("failed,", "cancelled,", 1))


def plan_resume(run: LoadedRun, step: str | None = None) -> Plan:
    """A resume: the failed reversal runs again, then the rest."""
    refused = _not_parked(run, "resume")
    if refused is not None:
        return refused
    records = [
        replace(s, compensation_status=None)
        if s.compensation_status is CompensationOutcome.FAILED
        else s
        for s in run.steps
    ]
    return unwind_from(run, records, "resume")


def plan_resolve(run: LoadedRun, step: str | None = None) -> Plan:
    """A resolve of ``step`` (default: the parked one): done by hand, then the rest."""
    refused = _not_parked(run, "resolve")
    if refused is not None:
        return refused
    parked = parked_reversal(run.steps, run.record.committed_at is not None)
    if parked is None or (step is not None and step != parked.name):
        at = f"step {parked.name!r}" if parked else "no failed reversal"
        why = f"the run is parked at {at}, not at step {step!r}"
        return replace(_base(run, "resolve", step), refused=why)
    by_hand = replace(parked, compensation_status=CompensationOutcome.RESOLVED)
    records = [by_hand if s.id == parked.id else s for s in run.steps]
    return replace(unwind_from(run, records, "resolve"), step=parked.name)


def plan_abandon(run: LoadedRun, step: str | None = None) -> Plan:
    """An abandon: nothing runs; the steps never reversed are marked skipped."""
    refused = _not_parked(run, "abandon")
    if refused is not None:
        return refused
    left = outstanding_steps(run.steps, run.record.committed_at is not None)
    return replace(
        _base(run, "abandon"),
        skipped=tuple(s.name for s in left),
        ends="failed, rollback stuck",
    )


def path_from(definition: SagaDefinition, step: str, *, including: bool) -> tuple[str, ...]:
    """The nodes a run would run next from the node holding ``step`` (that node too when
    ``including``: a retry; a skip goes on after it, or with the rest of its group), as an
    operator names them; ``pivot`` where it stands. ``()`` for a step not in ``definition``."""
    base = split_iteration(step)[0]
    for index, node in enumerate(definition.nodes):
        if base not in {s.name for s in node_steps(node)}:
            continue
        grouped = len(node_steps(node)) > 1
        start = index if including or grouped else index + 1
        return tuple(
            "pivot" if isinstance(n, PivotNode) else node_name(n) for n in definition.nodes[start:]
        )
    return ()


#: A move's planner: the loaded run and the step the move names (None: none or its default).
Planner = Callable[[LoadedRun, "str | None"], Plan]

#: Every move that can be planned; a new move is one entry (its name and its planner).
PLANNERS: dict[str, Planner] = {
    "unwind": plan_unwind,
    "cancel": plan_cancel,
    "resume": plan_resume,
    "resolve": plan_resolve,
    "abandon": plan_abandon,
}
