"""What ``celery saga show`` prints of a run's data: the described run (``timeline.describe``)
with every value its saga marks sensitive replaced by ``[redacted]``, in its input, step
results, signal payloads and history data, and scrubbed from its failure texts; child runs,
and the parent's record of each, by their own saga's markings; a run of a saga this process
does not have shows none of its data (``run_markings``). ``show --reveal`` skips this."""

from __future__ import annotations

from typing import Any

from celery_saga.cli.chronology import events
from celery_saga.definition.run_markings import FindDefinition, run_markings
from celery_saga.definition.sensitivity import Sensitivity
from celery_saga.redaction import redact, run_secrets, scrub


def redacted(run: dict[str, Any], find: FindDefinition) -> dict[str, Any]:
    """A copy of ``run`` as ``show`` may print it without ``--reveal``."""
    marks = run_markings(find, run["saga"], run["definition_hash"])
    results = {s["name"]: s["result"] for s in run["steps"] if s["result"] is not None}
    signals = {s["event"]: s["payload"] for s in run["signals"]}
    secrets = run_secrets(marks, run["input"], results, signals)

    def text(value: str | None) -> str | None:
        return None if value is None else scrub(value, secrets)

    shown = {**run, "input": redact(run["input"], ("input",), marks)}
    for label in ("failure_reason", "rollback_reason"):
        shown[label] = text(run[label])
    shown["signals"] = [
        {**s, "payload": redact(s["payload"], ("signals", s["event"]), marks)}
        for s in run["signals"]
    ]
    shown["steps"] = [_step(step, marks, secrets, find) for step in run["steps"]]
    shown["history"] = [
        {
            **entry,
            "detail": text(entry["detail"]),
            "data": redact(entry["data"], ("results", entry["step"] or ""), marks),
        }
        for entry in run["history"]
    ]
    if "timeline" in run:  # drawn again from what is shown: its lines quote failure texts
        shown["timeline"] = events(shown)
    return shown


def _step(
    step: dict[str, Any], marks: Sensitivity, secrets: frozenset[str], find: FindDefinition
) -> dict[str, Any]:
    shown = {
        **step,
        "result": redact(step["result"], ("results", step["name"]), marks),
        "error": None if step["error"] is None else scrub(step["error"], secrets),
    }
    reversal = step["compensation"]
    if reversal is not None and reversal["reason"] is not None:
        shown["compensation"] = {**reversal, "reason": scrub(reversal["reason"], secrets)}
    child = step["child"]
    if child is not None and not child.get("missing"):
        shown["child"] = redacted(child, find)
    return shown
