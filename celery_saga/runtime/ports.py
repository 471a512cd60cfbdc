"""What the runtime needs from the outside: publishing messages, emitting events, settings."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from celery_saga.decisions.admission import NodeMessage
from celery_saga.decisions.lost_claims import MINE
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.nodes import StepSpec
from celery_saga.errors import VersionNotDeployedError
from celery_saga.records import StepAttempt
from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.heartbeat import Renewal, keep_lease
from celery_saga.runtime.holders import Holders
from celery_saga.runtime.lost_claims import LostClaims
from celery_saga.runtime.takeovers import Renewals
from celery_saga.store.codec import DEFAULT_MAX_PAYLOAD_BYTES
from celery_saga.store.database import Database

__all__ = ["Catalog", "EventSink", "Publisher", "RuntimeParts", "Settings"]


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
    before the engine gives up on it (guarantee 20).
    """

    lease_seconds: float = 30.0
    compensation_timeout: float = 30.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    hard_limit_grace: float = 10.0
    recover_after: float = 45.0
    store_retry_budget: float = 15.0
    outcome_retry_budget: float = 600.0

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
        )


class RuntimeParts:
    """What the forward executor and the unwinder share: the store, the deployed
    definitions, the way out to the broker, the event sink, the settings, and who this
    process is as a claim's holder and how it asks other holders (``holders``; without a
    worker's remote control, ``Holders()``)."""

    def __init__(
        self,
        db: Database,
        registry: Catalog,
        publisher: Publisher,
        emit: EventSink,
        settings: Settings,
        holders: Holders | None = None,
    ) -> None:
        self.db, self.registry, self.publisher = db, registry, publisher
        self.emit, self.settings = emit, settings
        self.holders = Holders() if holders is None else holders
        self.lost_claims = LostClaims(db, settings.lease_seconds)
        self.renewals = Renewals(db, self.lost_claims)

    def parts(self) -> RuntimeParts:
        """The same parts on their own, for a helper that must not hold its owner."""
        return RuntimeParts(
            self.db, self.registry, self.publisher, self.emit, self.settings, self.holders
        )

    def until_released(self, lease_expires_at: datetime | None, live: bool) -> float:
        """Seconds a redelivered message left to a claim's holder waits before it is tried
        again: until the live lease ends, or a whole lease once its holder renewed it."""
        if live and lease_expires_at is not None:
            return max(1.0, (lease_expires_at - get_clock().now()).total_seconds() + 1)
        return self.lease + 1

    @property
    def lease(self) -> float:
        return self.settings.lease_seconds

    def restore_step(self, definition: SagaDefinition, step: StepAttempt) -> bool:
        """An outcome of ``step`` matched nothing: whether its claim is its own again, as
        the store had lost it and it was written back (here, or a moment ago by the lease's
        heartbeat): then the outcome is written again."""
        spec = definition.find_step(step.name)
        compensatable = True if spec is None else spec.compensatable
        return self.lost_claims.step(step, compensatable) in MINE

    def holding(self, renew: Renewal, what: str) -> AbstractContextManager[None]:
        """Keep this claim's lease alive while the block runs: the body, and the write of
        its outcome. Not on a store with one shared connection (in-memory SQLite): the
        heartbeat thread must not interleave with the task's transaction there."""
        if self.db.single_connection:
            return nullcontext()
        return keep_lease(renew, self.lease, what)
