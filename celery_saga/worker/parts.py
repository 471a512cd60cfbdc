"""What the worker's modules use of one engine, as one value: ``SagaEngine`` builds it once
and hands it to each module that acts for it, so none of them reaches into the engine (or
imports it). A module that needs one more thing takes it here, not from the engine."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.executor import Executor
from celery_saga.runtime.ports import Settings
from celery_saga.store.database import Database
from celery_saga.tracing import Tracer
from celery_saga.worker.event_hub import EventHub
from celery_saga.worker.hand_back_notes import HandBackNotes
from celery_saga.worker.publisher import CeleryPublisher
from celery_saga.worker.shape_book import ShapeBook
from celery_saga.worker.store_calls import StoreCalls


@dataclass(frozen=True)
class WorkerParts:
    """One engine's parts: its ``app`` and store (``db``; ``store`` runs a public call's
    store work), the registered definitions (``catalog``), where its events go, how its
    messages are sent, the runtime that moves runs (``executor``), and what identifies its
    store in a message (``store_id``) and to a reader (``shown_store``), with the worker's
    memory of the messages it handed back (``notes``) and of the versions whose shapes it
    stored (``shapes``)."""

    app: Celery
    db: Database
    store: StoreCalls
    catalog: Catalog
    events: EventHub
    publisher: CeleryPublisher
    executor: Executor
    store_id: str
    shown_store: str
    notes: HandBackNotes
    shapes: ShapeBook

    @property
    def tracer(self) -> Tracer:
        """The spans of runs (``celery_saga.tracing``)."""
        return self.executor.parts.tracer

    @property
    def settings(self) -> Settings:
        """The engine's settings as they are now (see ``StoreCalls``)."""
        return self.store.settings
