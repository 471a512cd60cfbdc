"""What the runtime needs from the outside: publishing messages, emitting events, settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import SagaError, VersionNotDeployedError
from celery_saga.runtime.catalog import Catalog
from celery_saga.store.codec import DEFAULT_MAX_PAYLOAD_BYTES

__all__ = ["Catalog", "EventSink", "Publisher", "Settings"]


class Publisher(Protocol):
    def publish_node(
        self,
        saga_name: str,
        spec: StepSpec | None,
        message: NodeMessage,
        countdown: float | None = None,
        label: str | None = None,
        version: str | None = None,
    ) -> None:
        """Send the node task for ``message``, routed and named after ``spec``'s action
        (a control node without a step is named ``label``); ``version`` is the hash of the
        definition the run is on, named in the message."""

    def publish_compensation(
        self,
        saga_name: str,
        spec: StepSpec | None,
        execution_id: str,
        step_name: str,
        attempt: int,
        countdown: float | None = None,
        version: str | None = None,
    ) -> None:
        """Send the compensate task for one reversal (of the run on ``version``)."""

    def hand_on(
        self, missing: VersionNotDeployedError, execution_id: str, command: str, **arguments: Any
    ) -> None:
        """Send a call on a run whose version this process lacks (``missing``) to a
        worker that has it, to carry ``command`` out there (guarantee 22)."""


class EventSink(Protocol):
    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        """Deliver one saga event (``saga-step-completed`` ...) with its fields."""


@dataclass(frozen=True)
class Settings:
    """Engine-wide knobs (read from the Celery app's ``saga_*`` settings).

    ``lease_seconds``: how long a claim on a step or reversal protects it from a duplicate
    message; renewed every third of it while the body runs, so it bounds how soon a lost
    worker's step is picked up again, not how long a body may run;
    ``compensation_timeout``: the default reversal timeout (guarantee 7);
    ``max_payload_bytes``: largest encoded input or result; ``hard_limit_grace``: seconds
    between a timeout's soft time limit and the hard limit that stops the pool process
    (plus ``outcome_retry_budget``, so the hard limit never cuts an outcome write short);
    ``recover_after``: how long a live run may go without progress before the recovery
    sweep republishes its next message (keep it above every step's ``backoff_max``);
    ``store_retry_budget``: how long a call that has done nothing yet (the public API, a
    claim) retries a store that cannot be reached; ``outcome_retry_budget``: how long the
    record of something already done (a step's result, a reversal's outcome) is retried
    before the engine gives up on it (guarantee 20); ``tracing``: whether runs are traced
    with OpenTelemetry (``celery_saga.tracing``).
    """

    lease_seconds: float = 30.0
    compensation_timeout: float = 30.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    hard_limit_grace: float = 10.0
    recover_after: float = 45.0
    store_retry_budget: float = 15.0
    outcome_retry_budget: float = 600.0
    #: ``saga_tracing``: True, False, or None (on when a tracer provider is set).
    tracing: bool | None = None

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Settings:
        """The settings a Celery app's configuration gives as ``saga_<name>`` (the default
        for each one it leaves unset)."""
        defaults = cls()

        def number(name: str) -> float:
            value = conf.get(f"saga_{name}")
            return float(getattr(defaults, name) if value is None else value)

        return cls(
            lease_seconds=number("lease_seconds"),
            compensation_timeout=number("compensation_timeout"),
            max_payload_bytes=int(number("max_payload_bytes")),
            hard_limit_grace=number("hard_limit_grace"),
            recover_after=number("recover_after"),
            store_retry_budget=number("store_retry_budget"),
            outcome_retry_budget=number("outcome_retry_budget"),
            tracing=_tracing(conf.get("saga_tracing")),
        )


def _tracing(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise SagaError(f"saga_tracing must be True, False or None (unset), got {value!r}")
