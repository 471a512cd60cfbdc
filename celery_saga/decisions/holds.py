"""Which step a held run waits on: read by the store's moves and by the plan."""

from __future__ import annotations

from collections.abc import Sequence

from celery_saga.records import ExecutionRecord, StepRecord, StepStatus


def held_step_of(execution: ExecutionRecord, steps: Sequence[StepRecord]) -> StepRecord | None:
    """The step a held run waits on: the failed record at its cursor."""
    at = (execution.cursor, execution.cursor_sub)
    return next(
        (s for s in reversed(steps) if (s.node, s.sub) == at and s.status is StepStatus.FAILED),
        None,
    )
