"""A stored run as a view may show it without ``--reveal``: every value its saga marks
sensitive replaced by ``[redacted]`` in its input, step results, signal payloads and
history data, and scrubbed from its failure texts; child runs, read on their own, by their
own saga's markings, and the parent's record of each by the child's at that record; a run
of a saga this process does not have shows none of its data (``run_markings``). Redacted
before the run is described, so its graph and timeline quote only what may be shown."""

from __future__ import annotations

from dataclasses import replace

from celery_saga.definition.run_markings import FindDefinition, run_markings
from celery_saga.redaction import redact, run_secrets, scrub
from celery_saga.store.inspection import StoredRun


def _text(value: str | None, secrets: frozenset[str]) -> str | None:
    return None if value is None else scrub(value, secrets)


def redacted(run: StoredRun, find: FindDefinition) -> StoredRun:
    """A copy of ``run`` with what its saga marks sensitive redacted."""
    record = run.record
    marks = run_markings(find, record.saga_name, record.definition_hash)
    results = {s.name: s.result for s in run.steps if s.result is not None}
    signals = {s.event: s.payload for s in run.signals}
    secrets = run_secrets(marks, record.input, results, signals)
    shown_record = replace(
        record,
        input=redact(record.input, ("input",), marks),
        failure_reason=_text(record.failure_reason, secrets),
        rollback_reason=_text(record.rollback_reason, secrets),
    )
    steps = tuple(
        replace(
            step,
            result=redact(step.result, ("results", step.name), marks),
            error=_text(step.error, secrets),
            compensation_reason=_text(step.compensation_reason, secrets),
        )
        for step in run.steps
    )
    shown_signals = tuple(
        replace(s, payload=redact(s.payload, ("signals", s.event), marks)) for s in run.signals
    )
    history = tuple(
        replace(
            row,
            detail=_text(row.detail, secrets),
            data=redact(row.data, ("results", row.step or ""), marks),
        )
        for row in run.history
    )
    return replace(run, record=shown_record, steps=steps, signals=shown_signals, history=history)
