"""A move's plan (``decisions/plan.Plan``) as ``celery saga plan`` and ``--dry-run`` print
it, as ``plan --json`` prints it, and as the web view's confirmation pages show it. Pure."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from celery_saga.decisions.plan import Plan
from celery_saga.inspect.jsonable import as_json


def _value(value: Any) -> str:
    return json.dumps(json.loads(as_json(value)), separators=(", ", ": "))


def plan_lines(plan: Plan) -> list[str]:
    """The plan, one fact a line: the move, the reversals in order with their inputs, the
    steps past the pivot, what is skipped, the path the run takes next, where it ends."""
    head = f"plan: {plan.move} of {plan.execution_id} (saga {plan.saga}, {plan.state})"
    if plan.refused is not None:
        return [head, f"refused: {plan.refused}"]
    lines = [head]
    if plan.step is not None:
        lines.append(f"step: {plan.step} (its reversal recorded as done by hand)")
    lines += [f"settled: {name} ({outcome})" for name, outcome in plan.settled]
    lines.append(f"reversals, in order: {len(plan.reversals)}")
    for number, reversal in enumerate(plan.reversals, 1):
        lines.append(
            f"  {number}. {reversal.step} ({reversal.step_status}) "
            f"result={_value(reversal.result)} forward_key={reversal.forward_key}"
        )
    if plan.reversals:
        lines.append(f"each compensation also receives the input {_value(plan.input)}")
    if plan.halts_at is not None:
        lines.append(f"halts at: {plan.halts_at} (its compensation is not in the run's version)")
    if plan.past_pivot:
        lines.append(f"past the pivot, never reversed: {', '.join(plan.past_pivot)}")
    if plan.skipped:
        lines.append(f"marked compensation_skipped: {', '.join(plan.skipped)}")
    if plan.path:
        lines.append(f"runs next: {' -> '.join(plan.path)}")
    if plan.ends:
        lines.append(f"ends: {plan.ends}")
    return lines


def plan_json(plan: Plan) -> str:
    """The plan as JSON (payloads in their readable forms)."""
    return as_json(dataclasses.asdict(plan))
