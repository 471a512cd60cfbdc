"""Versions side by side, for operators (guarantee 22): which versions of each saga exist,
where they were seen, how many live runs each still has, and moving a run to another one.

Where a version was seen comes from the store: every worker upserts one row per version it
registered when it starts, and again every ``SEEN_EVERY`` seconds while it runs
(``saga_versions``), so the list covers workers that are stopped now (with when they were
last seen running) and needs no broker round trip; Celery's remote control would only show
the workers answering at that moment.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.versions import VersionRef, decide_upgrade, find_version
from celery_saga.definition.builder import SagaDefinition
from celery_saga.definition.shapes import shape_of
from celery_saga.errors import (
    ExecutionNotFoundError,
    InvalidStateError,
    SagaError,
    StoreConfigurationError,
    UpgradeRefusedError,
)
from celery_saga.limits import check_lookup_id
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.process_name import process_name, set_process_name
from celery_saga.store import queries, versions
from celery_saga.worker.celery_hooks import CeleryHooks
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.version_check import run_shape

logger = logging.getLogger("celery_saga")


@dataclass(frozen=True)
class VersionInfo:
    """One version of one saga: ``registered_here`` in this process (``newest_here``: new
    runs started here use it), ``seen_by`` the workers that registered it (last started at
    ``last_seen``), ``live_runs`` its runs that are not over."""

    saga: str
    hash: str
    label: str | None
    registered_here: bool
    newest_here: bool
    seen_by: tuple[str, ...]
    last_seen: datetime | None
    live_runs: int


#: How often a running worker says again which versions it has (``last_seen``).
SEEN_EVERY = 300.0


class Versions:
    """The versions of one engine (``parts``); ``hooks`` name the worker this process runs."""

    def __init__(self, parts: WorkerParts, hooks: CeleryHooks) -> None:
        self.parts = parts
        self.hooks = hooks
        self._seen_from: int | None = None

    def announce(self) -> None:
        """A worker starts: name this process after it, record its versions, and keep
        recording them while it runs (one thread per process)."""
        if self.hooks.worker_name:
            set_process_name(self.hooks.worker_name)
        self._record()
        if self._seen_from != os.getpid():
            self._seen_from = os.getpid()
            threading.Thread(target=self._keep_seen, name="saga-versions", daemon=True).start()

    def _keep_seen(self) -> None:
        while True:
            time.sleep(SEEN_EVERY)
            self._record()

    def _record(self) -> None:
        parts = self.parts
        catalog = parts.catalog
        registered = [
            (d.name, d.hash, d.label) for n in catalog.names() for d in catalog.versions(n)
        ]
        try:
            parts.store.ensure_schema()
            parts.shapes.store(d for n in catalog.names() for d in catalog.versions(n))
            versions.record_seen(
                parts.db, registered, seen_by=process_name(), now=get_clock().now()
            )
        except StoreConfigurationError as refused:  # no use to anything of the engine's
            logger.error("the saga store cannot be used: %s", refused)
        except (SQLAlchemyError, SagaError) as error:
            logger.warning("the versions this worker has were not recorded: %s", error)

    def report(self) -> list[VersionInfo]:
        parts = self.parts
        parts.store.ensure_schema()
        seen = versions.list_seen(parts.db)
        live = versions.live_runs(parts.db)
        keys: dict[tuple[str, str], str | None] = {}
        for row in seen:
            keys.setdefault((row.saga_name, row.definition_hash), row.label)
        for name in parts.catalog.names():
            for definition in parts.catalog.versions(name):
                keys.setdefault((name, definition.hash), definition.label)
        for key in live:
            keys.setdefault(key, None)
        report = []
        for (saga, version), label in keys.items():
            rows = [r for r in seen if (r.saga_name, r.definition_hash) == (saga, version)]
            here = parts.catalog.known(saga, version)
            newest = parts.catalog.known(saga)
            report.append(
                VersionInfo(
                    saga,
                    version,
                    label,
                    here is not None,
                    newest is not None and newest.hash == version,
                    tuple(r.seen_by for r in rows),
                    max((r.last_seen for r in rows), default=None),
                    live.get((saga, version), 0),
                )
            )
        return sorted(report, key=lambda v: (v.saga, v.last_seen is None, v.last_seen or 0))

    def upgrade(
        self,
        execution_id: str,
        to: str | None = None,
        actor: str | None = None,
        dry_run: bool = False,
    ) -> SagaDefinition:
        """Move run ``execution_id`` to version ``to`` (a hash, hash prefix or label; the
        newest registered here by default). Refused, with nothing stored, unless every node
        the run has reached is the same in that version. The run's own version need not be
        registered here: its shape is read from the store. ``actor`` (else this process's
        name) is recorded in the run's history. ``dry_run``: check only, store nothing."""
        parts = self.parts
        check_lookup_id(execution_id)
        parts.store.ensure_schema()
        record, _ = queries.load_snapshot(parts.db, execution_id)
        if record is None or record.id != execution_id:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        # Without the run's version here, its shape as the store keeps it: the old code
        # need not be deployed anywhere (tests/test_upgrade_without_old_code.py).
        current = run_shape(parts, record.saga_name, record.definition_hash, record.id)
        target = self._target(record.saga_name, to)
        if target.hash == current.hash:
            raise UpgradeRefusedError(
                f"execution {execution_id!r} already runs version {current.hash}"
            )
        if record.state.value not in versions.LIVE_STATES:
            raise InvalidStateError(
                f"execution {execution_id!r} is {record.state.value}; only a run that is not "
                "over can move to another version"
            )
        verdict = decide_upgrade(record.cursor, current.nodes, shape_of(target).nodes)
        if not verdict.allowed:
            raise UpgradeRefusedError(
                f"execution {execution_id!r} cannot move to version {target.hash}: "
                f"{verdict.reason}; nothing was changed"
            )
        if dry_run:  # every refusal above made: the move would be allowed now
            return target
        with parts.tracer.action("upgrade", execution_id, actor, record.trace_context):
            moved = versions.move_to_version(
                parts.db,
                execution_id=execution_id,
                seen_version=record.version,
                from_hash=current.hash,
                to_hash=target.hash,
                actor=actor or process_name(),
                now=get_clock().now(),
            )
        if not moved:
            raise UpgradeRefusedError(
                f"execution {execution_id!r} moved while it was checked; nothing was changed, "
                "try again"
            )
        logger.info("execution %s moved to version %s", execution_id, target.hash)
        return target

    def _target(self, saga: str, to: str | None) -> SagaDefinition:
        registered = self.parts.catalog.versions(saga)
        refs = [VersionRef(d.hash, d.label) for d in registered]
        found = refs[-1] if to is None and refs else find_version(to or "", refs)
        if found is None:
            known = ", ".join(f"{r.hash} ({r.label})" if r.label else r.hash for r in refs)
            raise SagaError(
                f"no version {to!r} of saga {saga!r} is registered in this process "
                f"(known: {known or 'none'})"
            )
        return next(d for d in registered if d.hash == found.hash)
