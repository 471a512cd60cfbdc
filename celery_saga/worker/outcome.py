"""What a step's task reports to Celery once the engine has recorded the step's outcome.

The engine task records a failed attempt in the store and returns; left there, Celery would
log ``Task shop.charge[...] succeeded`` and Flower would show SUCCESS for a step that failed.
Each engine task watches the events its own thread emits and, after the outcome is stored,
ends the way the step did: ``Retry`` for an attempt the engine will try again, ``StepFailed``
for a definitive failure. ``StepFailed`` is declared in the task's ``throws``, so Celery logs
it as one INFO line (the engine already logged the error with its traceback), and with
``acks_late`` the message is acknowledged as on success.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import Retry

from celery_saga.errors import SagaError
from celery_saga.worker.events import EventHub

_FAILED = {"saga-step-failed", "saga-compensation-failed"}
_RETRIED = {"saga-step-retry", "saga-compensation-retry"}
_local = threading.local()


class StepFailed(SagaError):
    """A step or reversal failed definitively; its outcome is already recorded."""


@dataclass
class Observation:
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def verdict(self) -> tuple[str, str, float] | None:
        """("failed" or "retry", a sentence, the retry's countdown) for an attempt that
        failed; None for one that did not."""
        for event, fields in self.events:
            what = "reversal of step" if "compensation" in event else "step"
            text = f"{what} {fields.get('step')!r} of saga {fields.get('saga')!r}"
            error = f"{text} attempt {fields.get('attempt')} failed: {fields.get('error')}"
            countdown = float(fields.get("countdown", 0))
            if event in _FAILED:
                return "failed", error, countdown
            if event in _RETRIED:
                return "retry", f"{error}; retry in {countdown:.3g}s", countdown
        return None

    def raise_outcome(self) -> None:
        """Raise what tells Celery the attempt failed (nothing if it did not)."""
        verdict = self.verdict()
        if verdict is None:
            return
        event, text, countdown = verdict
        if event == "failed":
            raise StepFailed(text)
        raise Retry(text, when=countdown)


def _note(event: str, fields: dict[str, Any]) -> None:
    observation = getattr(_local, "observation", None)
    if observation is not None:
        observation.events.append((event, fields))


def watch(hub: EventHub) -> None:
    for event in (*_FAILED, *_RETRIED):
        hub.subscribe(event, _note)


@contextmanager
def observed() -> Iterator[Observation]:
    """Collect the failure events this thread emits inside the block."""
    observation = Observation()
    previous, _local.observation = getattr(_local, "observation", None), observation
    try:
        yield observation
    finally:
        _local.observation = previous
