"""Which versions' shapes this process has stored (``saga_version_shapes``), so that each
version costs one read (and one insert, the first time in the store) per process: when a
worker starts, for every version it registered, and when a run starts on a version. Every
run started since then has its version's shape in the store, whatever code is deployed
later (guarantee 22)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.hashing import shape_text
from celery_saga.runtime.clock import get_clock
from celery_saga.store.database import Database
from celery_saga.store.version_shapes import record_shapes


class ShapeBook:
    """The versions whose shapes this process stored in ``db``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._stored: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def store(self, definitions: Iterable[SagaDefinition]) -> None:
        """Store the shapes of ``definitions`` this process has not stored yet; nothing to
        do (no I/O) once it has."""
        with self._lock:
            new = [d for d in definitions if (d.name, d.hash) not in self._stored]
        if not new:
            return
        shapes = [(d.name, d.hash, d.label, shape_text(d.name, d.nodes, d.label)) for d in new]
        record_shapes(self.db, shapes, now=get_clock().now())
        with self._lock:
            self._stored.update((d.name, d.hash) for d in new)
