"""How a ``SagaEngine`` is put together: its store, its parts, and its hooks into Celery.

``assemble`` builds the parts once (``WorkerParts``) and the services around them, gives
the Celery hooks what they call, changes Celery for the app (through ``celery_hooks``),
and returns what the engine keeps. Nothing here knows the engine."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from celery import Celery

from celery_saga.encryption import codec_from_conf
from celery_saga.runtime import revocation, stopping
from celery_saga.runtime.catalog import Catalog
from celery_saga.runtime.executor import Executor
from celery_saga.runtime.ports import Settings
from celery_saga.runtime.recovery import Recoverer
from celery_saga.store.codec import use_codec
from celery_saga.store.database import Database
from celery_saga.store.identity import shown_store, store_identity
from celery_saga.store.replica import open_replica
from celery_saga.worker import arrivals, hand_back_notes, holders, pool_loss
from celery_saga.worker.beat import install_beat_entries
from celery_saga.worker.celery_hooks import CeleryHooks
from celery_saga.worker.delivery import stopped_by_worker
from celery_saga.worker.discovery import SagaDiscovery
from celery_saga.worker.event_hub import EventHub
from celery_saga.worker.hand_back import HandBacks
from celery_saga.worker.hand_back_notes import HandBackNotes
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.publisher import CeleryPublisher
from celery_saga.worker.revocation import remember_worker_process, revoke_announced
from celery_saga.worker.shape_book import ShapeBook
from celery_saga.worker.step_run import StepRun
from celery_saga.worker.step_tasks import StepTasks
from celery_saga.worker.store_calls import StoreCalls
from celery_saga.worker.sweeps import Sweeps
from celery_saga.worker.tasks import register_tasks
from celery_saga.worker.versioning import Versions


@dataclass(frozen=True)
class Assembly:
    """What the engine keeps of its assembly."""

    db: Database
    events: EventHub
    catalog: Catalog
    parts: WorkerParts
    hooks: CeleryHooks
    discovery: SagaDiscovery
    step_tasks: StepTasks
    recoverer: Recoverer
    sweeps: Sweeps
    versioning: Versions
    hand_backs: HandBacks


def assemble(app: Celery, store_url: str) -> Assembly:
    """Build everything a ``SagaEngine`` on ``app`` acts through, its store at ``store_url``."""
    db = Database(store_url, sqlite_synchronous=app.conf.get("saga_sqlite_synchronous") or "NORMAL")
    if app.conf.get("saga_durable_claims"):
        db.durable_claims = True
    # Operators' reads (list, show, stats, the web view, the admin) off the primary.
    db.replica = open_replica(db, app.conf.get("saga_read_store_url"))
    # Every payload this process stores or reads goes through the app's codec.
    use_codec(codec_from_conf(app.conf))
    events = EventHub(app)
    catalog = Catalog(discover=lambda: discovery.discover())
    parts = _parts(app, db, catalog, events, Settings.from_conf(app.conf))
    hooks = CeleryHooks(app, StepRun(parts), events)
    discovery = SagaDiscovery(app, hooks.when_modules_imported)
    step_tasks = parts.publisher.tasks = StepTasks(app, hooks)
    recoverer = Recoverer(parts.executor)
    parts.publisher.on_unsent = recoverer.owe_message
    sweeps = Sweeps(parts, recoverer)
    register_tasks(parts, sweeps)
    install_beat_entries(app)
    versioning = Versions(parts, hooks)
    hand_backs = HandBacks(parts)
    _hook_in(parts, hooks, versioning, hand_backs)
    return Assembly(
        db=db,
        events=events,
        catalog=catalog,
        parts=parts,
        hooks=hooks,
        discovery=discovery,
        step_tasks=step_tasks,
        recoverer=recoverer,
        sweeps=sweeps,
        versioning=versioning,
        hand_backs=hand_backs,
    )


def _parts(
    app: Celery, db: Database, catalog: Catalog, events: EventHub, settings: Settings
) -> WorkerParts:
    store_id = store_identity(db.url)
    publisher = CeleryPublisher(
        app,
        # The hard limit must not kill a process that is still recording what its body
        # did through a store outage (guarantee 20): an outcome, then perhaps the park
        # of an unwind, each retried for that budget.
        hard_limit_grace=settings.hard_limit_grace + 2 * settings.outcome_retry_budget,
        compensation_timeout=settings.compensation_timeout,
    )
    publisher.store = store_id
    # The holders ask other workers through this engine's app.
    executor = Executor(db, catalog, publisher, events, settings, holders.CeleryHolders(app))
    return WorkerParts(
        app=app,
        db=db,
        store=StoreCalls(db, settings),
        catalog=catalog,
        events=events,
        publisher=publisher,
        executor=executor,
        store_id=store_id,
        shown_store=shown_store(db.url),
        notes=HandBackNotes(),
        shapes=ShapeBook(db),
    )


def _hook_in(
    parts: WorkerParts, hooks: CeleryHooks, versioning: Versions, hand_backs: HandBacks
) -> None:
    """Give the hooks what they call, then change Celery for this app."""
    hooks.commands[holders.COMMAND] = functools.partial(holders.answer_holder, parts)
    hooks.commands[holders.RUNS_COMMAND] = holders.answer_runs
    hooks.commands[hand_back_notes.COMMAND] = functools.partial(
        hand_back_notes.answer, parts.notes, parts.shown_store
    )
    hooks.commands[arrivals.COMMAND] = functools.partial(arrivals.answer, hand_backs)
    hooks.on_pool_loss = functools.partial(pool_loss.on_pool_loss, parts)
    hooks.when_worker_starts(pool_loss.PoolWatch(parts).start)
    hooks.when_worker_starts(versioning.announce)
    hooks.task_handler = hand_backs.task_handler
    hooks.on_consumer_start = functools.partial(arrivals.announce, parts)
    hooks.on_consumer_stop = hand_backs.let_go
    hooks.install()
    # A body cut short by this worker's shutdown is a lost attempt, not a failure.
    stopping.set_probe(stopped_by_worker)
    # A body its run's cancel stopped ends REVOKED only if its worker announced so.
    revocation.set_probe(revoke_announced)
    hooks.when_worker_starts(remember_worker_process)
