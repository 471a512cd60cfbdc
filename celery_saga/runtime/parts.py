"""The runtime's shared parts, as one frozen value that every piece of the runtime is
handed (never a base class to inherit): the store, the deployed definitions, the way out to
the broker, the event sink, the settings, who this process is as a claim's holder, and what
follows from those (writing back lost claims, renewing leases, tracing runs)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from celery_saga.decisions.lost_claims import MINE
from celery_saga.definition.builder import SagaDefinition
from celery_saga.records import Attempt, ExecutionRecord
from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.heartbeat import Renewal, keep_lease
from celery_saga.runtime.holders import Holders
from celery_saga.runtime.lost_claims import LostClaims
from celery_saga.runtime.ports import EventSink, Publisher, Settings
from celery_saga.runtime.store_retry import write_outcome
from celery_saga.runtime.takeovers import Renewals
from celery_saga.store.database import Database
from celery_saga.tracing import Tracer

T = TypeVar("T")


@dataclass(frozen=True)
class Parts:
    """What the forward executor, the unwinder and their helpers share. ``holders``: who
    this process is as a claim's holder and how it asks other holders (without a worker's
    remote control, ``Holders()``)."""

    db: Database
    registry: Catalog
    publisher: Publisher
    emit: EventSink
    settings: Settings
    holders: Holders = field(default_factory=Holders)
    lost_claims: LostClaims = field(init=False)
    renewals: Renewals = field(init=False)
    tracer: Tracer = field(init=False)

    def __post_init__(self) -> None:
        # What derives from the store and the lease, built once with the parts.
        lost = LostClaims(self.db, self.settings.lease_seconds)
        object.__setattr__(self, "lost_claims", lost)
        object.__setattr__(self, "renewals", Renewals(self.db, lost))
        object.__setattr__(self, "tracer", Tracer(self.settings.tracing))

    @property
    def lease(self) -> float:
        return self.settings.lease_seconds

    def definition_of(self, execution: ExecutionRecord) -> SagaDefinition:
        """The definition a run runs on: its own version (``VersionNotDeployedError``
        without it)."""
        return self.registry.for_run(execution.saga_name, execution.definition_hash, execution.id)

    def until_released(self, lease_expires_at: datetime | None, live: bool) -> float:
        """Seconds a redelivered message left to a claim's holder waits before it is tried
        again: until the live lease ends, or a whole lease once its holder renewed it."""
        if live and lease_expires_at is not None:
            return max(1.0, (lease_expires_at - get_clock().now()).total_seconds() + 1)
        return self.lease + 1

    def restore_step(self, definition: SagaDefinition, step: Attempt) -> bool:
        """An outcome of ``step`` matched nothing: whether its claim is its own again, as
        the store had lost it and it was written back (here, or a moment ago by the lease's
        heartbeat): then the outcome is written again."""
        spec = definition.find_step(step.name)
        compensatable = True if spec is None else spec.compensatable
        return self.lost_claims.step(step, compensatable) in MINE

    def write_step_outcome(
        self,
        definition: SagaDefinition,
        step: Attempt,
        write: Callable[[], T],
        *,
        what: str,
        landed: Callable[[], bool],
        if_landed: T,
        cause: BaseException | None = None,
    ) -> T:
        """Write an outcome of ``step`` through store outages (``write_outcome``, for the
        settings' ``outcome_retry_budget``), writing it again once its lost claim is back."""
        return write_outcome(
            write,
            budget=self.settings.outcome_retry_budget,
            what=what,
            landed=landed,
            if_landed=if_landed,
            cause=cause,
            restore=lambda: self.restore_step(definition, step),
        )

    def holding(self, renew: Renewal, what: str) -> AbstractContextManager[None]:
        """Keep this claim's lease alive while the block runs: the body, and the write of
        its outcome. Not on a store with one shared connection (in-memory SQLite): the
        heartbeat thread must not interleave with the task's transaction there."""
        if self.db.single_connection:
            return nullcontext()
        return keep_lease(renew, self.lease, what)
