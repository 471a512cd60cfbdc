"""``SagaEngine``: attaches sagas to an existing Celery app and is the Python API.

What it changes in Celery, it changes for its own app only, through ``celery_hooks``. The
engine builds its parts once (``WorkerParts``, in ``assembly``) and hands them to each module
that acts for it; none of them reaches back into the engine."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.decisions.plan import Plan
from celery_saga.decisions.versions import VersionRef
from celery_saga.definition.builder import Saga, SagaDefinition
from celery_saga.definition.sub_sagas import check_no_cycle
from celery_saga.errors import DefinitionError, ExecutionNotFoundError, SagaError, UnknownSagaError
from celery_saga.inspect.reads import Inspector
from celery_saga.limits import check_lookup_id, listed_saga_names
from celery_saga.records import Execution, ExecutionState, Pause, RollbackStatus
from celery_saga.runtime.ports import Settings
from celery_saga.store import flow, queries
from celery_saga.store.versions import waiting_for_version
from celery_saga.worker import (
    bulk,
    held_moves,
    pause_moves,
    run_commands,
    version_check,
)
from celery_saga.worker.arguments import check_actor, enum_values, page_start
from celery_saga.worker.assembly import assemble
from celery_saga.worker.discovery import Packages
from celery_saga.worker.event_hub import Listener
from celery_saga.worker.handle import SagaHandle
from celery_saga.worker.pause_moves import Unpaused
from celery_saga.worker.version_check import VersionCheck
from celery_saga.worker.versioning import VersionInfo

DEFAULT_STORE_URL = "sqlite:///celery_saga.sqlite3"


class SagaEngine:
    """Attach saga support to ``app``.

    The store URL comes from ``store_url``, else the app's ``saga_store_url`` setting, else a
    SQLite file ``celery_saga.sqlite3`` in the working directory; ``saga_read_store_url``
    names a read replica of it for the operators' reads (``store.replica``). Other settings:
    ``saga_lease_seconds``, ``saga_lease_margin``, ``saga_compensation_timeout``,
    ``saga_max_payload_bytes``, ``saga_recover_after``, ``saga_queue`` (queue for
    plain-function steps and the engine's own tasks), ``saga_tracing`` (OpenTelemetry,
    ``celery_saga.tracing``), and the beat settings of `celery_saga.worker.beat`.
    """

    def __init__(self, app: Celery, *, store_url: str | None = None) -> None:
        self.app = app
        built = assemble(app, store_url or app.conf.get("saga_store_url") or DEFAULT_STORE_URL)
        self.db, self.events, self.catalog = built.db, built.events, built.catalog
        self.parts = built.parts
        self.publisher, self.executor = built.parts.publisher, built.parts.executor
        self.hooks, self.discovery, self.step_tasks = built.hooks, built.discovery, built.step_tasks
        self.recoverer, self.sweeps = built.recoverer, built.sweeps
        self.versioning, self.hand_backs = built.versioning, built.hand_backs
        app.saga_engine = self

    @property
    def settings(self) -> Settings:
        """The app's ``saga_*`` settings; set anew, they apply from the next public call."""
        return self.parts.store.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self.parts.store.settings = settings

    @classmethod
    def of(cls, app: Celery) -> SagaEngine:
        """The engine attached to ``app``: ``SagaEngine(app)`` registers itself on the app,
        so commands, Django and exporters given only the app find the same engine."""
        engine = getattr(app, "saga_engine", None)
        if not isinstance(engine, cls):
            raise SagaError(
                f"the Celery app {app.main!r} has no SagaEngine; create one with "
                "SagaEngine(app) in the module that defines the app (or one it imports)"
            )
        return engine

    # -- schema and definitions -------------------------------------------------------
    def ensure_schema(self) -> None:
        """Apply the store's migrations once per process (no-op when already current)."""
        self.parts.store.ensure_schema()

    def register(self, *sagas: Saga) -> list[SagaDefinition]:
        """Seal and register definitions; re-registering an identical one is a no-op. A
        changed definition of a registered name is a new version beside the old one: new
        runs start on the version registered last, each run stays on its own. A changed
        graph under a ``version=`` label already registered is refused (``DefinitionError``
        naming both hashes), and nothing of the call is registered."""
        for saga in sagas:
            if not isinstance(saga, Saga):
                raise DefinitionError(
                    f"register() takes Saga builders, got {saga!r} ({type(saga).__name__})"
                )
        sealed = [saga.seal() for saga in sagas]
        check_no_cycle(self.catalog.known, sealed)
        self.catalog.check_labels(sealed)
        for definition in sealed:
            self.step_tasks.bind(definition)
        for definition in sealed:
            self.catalog.add(definition)
        return sealed

    def definition(self, name: str) -> SagaDefinition:
        definition = self.catalog(name)
        if definition is None:
            known = ", ".join(self.catalog.names()) or "none"
            raise UnknownSagaError(
                f"no saga named {name!r} is registered (known: {known}); sagas are "
                + self.discovery.where()
            )
        return definition

    def autodiscover_sagas(
        self, packages: Packages = None, related_name: str = "sagas", *, force: bool = False
    ) -> None:
        """Find the sagas registered in ``<package>.<related_name>`` of each package, as
        ``app.autodiscover_tasks()`` finds tasks; ``packages`` defaults to the installed
        Django apps. Lazy unless ``force``: a worker imports the modules when it starts, any
        other process when it first looks up a saga it does not know (then the Celery app's
        task modules too, so sagas registered in a ``tasks.py`` are found as well)."""
        self.discovery.request(packages, related_name, force)

    # -- running ----------------------------------------------------------------------
    def start(
        self,
        saga: str,
        input: Any = None,
        *,
        execution_id: str | None = None,
        timeout: float | timedelta | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> SagaHandle:
        """Start a run of the registered saga ``saga`` with ``input``; ``timeout`` (else the
        saga's own) cancels it when that much time has passed (guarantee 31). ``labels``
        (text keys to text values) are stored with the run, shown with it, and select it
        in filters (``label.KEY=VALUE``); a sub-saga's run carries none of its parent's."""
        definition = self.definition(saga)
        new_id = run_commands.start_run(
            self.parts, definition, input, execution_id, timeout, labels
        )
        return SagaHandle(self, new_id)

    def handle(self, execution_id: str) -> SagaHandle:
        return SagaHandle(self, execution_id)

    def get(self, execution_id: str) -> Execution:
        check_lookup_id(execution_id)
        self.ensure_schema()
        record, steps = self.parts.store.run(
            f"reading execution {execution_id!r}",
            lambda: queries.load_snapshot(self.db, execution_id),
        )
        if record is None or record.id != execution_id:  # MySQL finds 'a1' for 'A1 '
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        waits = self.parts.store.run(
            "reading version waits", lambda: waiting_for_version(self.db, [record.id])
        )
        waiting = waits[record.id].definition_hash if record.id in waits else None
        behind = None
        if record.state is ExecutionState.QUEUED:
            behind = self.parts.store.run(
                "reading a queued run's place", lambda: flow.queue_place(self.db, record.id)
            )
        return Execution(record, tuple(steps), waiting_for_version=waiting, queued_behind=behind)

    def list(
        self,
        *,
        saga: str | Iterable[str] | None = None,
        state: Any = None,
        rollback_status: Any = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> queries.Page:
        """One page of executions, oldest first; ``page.next_cursor`` fetches the next."""
        after = page_start(limit, cursor)
        names = listed_saga_names(saga)
        states = enum_values(ExecutionState, state, "state")
        rollback = enum_values(RollbackStatus, rollback_status, "rollback status")
        self.ensure_schema()
        return self.parts.store.run(
            "listing executions",
            lambda: queries.list_executions(
                self.db,
                saga_names=names,
                states=states,
                rollback_statuses=rollback,
                after=after,
                limit=limit,
            ),
        )

    def resume_compensation(self, execution_id: str, *, actor: str | None = None) -> None:
        """Retry the failed reversal of a ``compensation_stuck`` run and continue the unwind
        (in a process without the run's version: on a worker that has it, see ``signal``).
        ``actor`` (who asks: an operator, a web user) is recorded in the run's history."""
        run_commands.resume_run(self.parts, execution_id, actor)

    def resolve(self, execution_id: str, *, step: str, note: str, actor: str | None = None) -> None:
        """Record the failed reversal of ``step`` in a ``compensation_stuck`` run as done by
        hand (outcome ``compensation_resolved``; ``note`` and ``actor`` kept in its history)
        and continue the unwind with the next step (handed on as ``resume_compensation``)."""
        run_commands.resolve_run(self.parts, execution_id, step, note, actor)

    def plan(self, execution_id: str, move: str = "unwind", *, step: str | None = None) -> Plan:
        """What ``move`` (unwind, cancel, resume, resolve, abandon) would do to the run now,
        changing nothing: the reversals in order with their inputs, the steps past the pivot
        (``inspect().plan``)."""
        check_lookup_id(execution_id)
        return self.inspect().plan(execution_id, move, step)

    def abandon_compensation(
        self, execution_id: str, *, actor: str | None = None, reason: str | None = None
    ) -> int:
        """Give up a parked unwind: outstanding steps are marked skipped and the run ends
        ``failed`` with ``rollback_status`` ``stuck``. Returns how many steps were skipped.
        ``actor`` and ``reason`` (who gave it up, and why) are recorded in its history."""
        return run_commands.abandon_run(self.parts, execution_id, actor, reason)

    def cancel(
        self, execution_id: str, reason: str | None = None, *, actor: str | None = None
    ) -> CancelVerdict:
        """Cancel a run wherever it stands: no step starts any more, the bodies in flight
        are stopped, and what it did is unwound; it ends ``cancelled`` (guarantee 31).
        Refused with ``InvalidStateError`` past its pivot or once ended; a run already
        cancelled or unwinding is left as it is (the verdict says which). ``actor`` is
        recorded in the run's history."""
        return run_commands.cancel_run(self.parts, execution_id, reason, actor)

    def retry(
        self, execution_id: str, *, actor: str | None = None, reason: str | None = None
    ) -> None:
        """Run the held step of a ``held`` run again, with a fresh set of attempts and the
        same idempotency key; the run then goes on. See ``worker/held_moves.py``."""
        held_moves.retry_run(self.parts, execution_id, actor, reason)

    def skip(
        self,
        execution_id: str,
        *,
        result: Any = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Record the held step of a ``held`` run completed by hand with ``result`` (checked
        against its ``output_schema``); the run goes on, and a later unwind still reverses
        the step. See ``worker/held_moves.py``."""
        held_moves.skip_run(self.parts, execution_id, result, actor, reason)

    def unwind(
        self, execution_id: str, *, actor: str | None = None, reason: str | None = None
    ) -> None:
        """Begin the unwind of a ``held`` run now, as its step's failure would have; refused
        past its pivot (naming it). See ``worker/held_moves.py``."""
        held_moves.unwind_run(self.parts, execution_id, actor, reason)

    def pause(
        self,
        saga: str,
        step: str | None = None,
        *,
        reason: str,
        actor: str | None = None,
        dry_run: bool = False,
    ) -> Pause:
        """Pause ``step`` of ``saga`` (None: every step) for every run: a run that reaches it
        is held at its door (state ``held``, reason ``paused: <reason>``) before its body
        starts, a message already queued included. ``dry_run``: checked, nothing stored.
        See ``worker/pause_moves.py``."""
        return pause_moves.pause(self.parts, saga, step, reason, actor, dry_run)

    def unpause(
        self,
        saga: str,
        step: str | None = None,
        *,
        rate: float | None = None,
        actor: str | None = None,
        reason: str | None = None,
        progress: Callable[[int], None] | None = None,
        dry_run: bool = False,
    ) -> Unpaused:
        """Lift a pause, then release the runs it held, at most ``rate`` a second (None: no
        cap), each once, even when run again after an interruption; ``progress`` is told
        each count released. ``dry_run``: ``released`` is how many it holds; nothing changed."""
        return pause_moves.unpause(
            self.parts,
            saga,
            step,
            rate=rate,
            actor=actor,
            reason=reason,
            progress=progress,
            dry_run=dry_run,
        )

    def pauses(self) -> builtins.list[Pause]:
        """Every paused step (and whole saga), with how many runs each holds."""
        return pause_moves.list_pauses(self.parts)

    def signal(
        self, execution_id: str, event: str, payload: Any = None, *, actor: str | None = None
    ) -> bool:
        """Deliver ``event`` (with an optional storable ``payload``) to a run.

        Recorded once per (execution, event): a second signal raises
        ``DuplicateSignalError``; one to an unknown run ``ExecutionNotFoundError``, to a run
        that is not running or waiting ``InvalidStateError``, for an event its saga does not
        wait for ``UnknownEventError``; none of them stores anything. Returns True if this
        signal resumed the run (parked at that gate), False if it waits for the run to get
        there. A process without the run's version (guarantee 22) checks the payload and
        hands the signal on to a worker that has it, returning False; what that worker
        refuses is logged there. ``actor`` (who sent it) is recorded in the run's history.
        """
        return run_commands.signal_run(self.parts, execution_id, event, payload, actor)

    def recover(self, stale_after: float | None = None, *, actor: str | None = None) -> int:
        """Run one recovery sweep now: republish the next message of every live run idle for
        ``stale_after`` seconds (default ``saga_recover_after``). Beat runs it on its own.
        ``actor`` (who ran it) is recorded in each recovered run's history."""
        return self.sweeps.recover(stale_after, actor)

    def fire_timers(self) -> int:
        """Fail (and unwind) every run whose ``wait_for`` deadline has passed, cancel every
        run past its own deadline, and send the messages a broker outage left owed; returns
        how many runs were acted on. Beat runs it every ``saga_timer_interval`` seconds."""
        return self.sweeps.fire_timers()

    def cleanup(self, older_than: float | timedelta, *, budget: float | None = None) -> int:
        """Delete terminal runs not updated for ``older_than`` (inclusive), with their child
        runs; parked or waiting runs are never touched. Returns how many runs went. With
        ``budget`` (seconds) it stops after the batch that passes it; the next call goes on."""
        return self.sweeps.retire(older_than, archive=False, budget=budget)

    def archive(
        self,
        older_than: float | timedelta,
        *,
        budget: float | None = None,
        actor: str | None = None,
    ) -> int:
        """Move terminal runs not updated for ``older_than`` (inclusive) into the
        ``saga_*_archive`` tables, as ``cleanup`` would delete them, each with an
        ``archived`` history row naming ``actor`` (who archived it; None: beat)."""
        return self.sweeps.retire(older_than, archive=True, budget=budget, actor=actor)

    def inspect(self) -> Inspector:
        """The read API: runs as frozen values (graph, timeline, history, lists, counts),
        what ``celery saga show``, the web view and the Django admin render."""
        return Inspector(
            self.db,
            self.catalog,
            lambda: [VersionRef(v.hash, v.label) for v in self.versions()],
            self.ensure_schema,
        )

    def versions(self) -> builtins.list[VersionInfo]:
        """Every version of every saga: registered here, seen on workers, or with live runs."""
        return self.parts.store.run("listing versions", self.versioning.report)

    def check_versions(self) -> VersionCheck:
        """The runs that are not over whose version is not registered here, each with what
        ``upgrade`` can do for it: what deploying only this process's versions would strand
        (``saga versions check``). Sagas to be autodiscovered are looked for first: a run
        is not stranded by a version this process has not imported yet."""
        self.discovery.discover()
        self.ensure_schema()
        return self.parts.store.run(
            "checking versions", lambda: version_check.check_versions(self.parts)
        )

    def upgrade(
        self,
        execution_id: str,
        to: str | None = None,
        *,
        actor: str | None = None,
        dry_run: bool = False,
    ) -> SagaDefinition:
        """Move a run to version ``to`` (hash or label; default: the newest registered here);
        ``UpgradeRefusedError`` naming the first node that differs, nothing stored.
        ``dry_run``: make every check, move nothing, return the version it would move to."""
        check_actor(actor)
        return self.parts.store.run(
            f"upgrading {execution_id!r}",
            lambda: self.versioning.upgrade(execution_id, to, actor, dry_run),
        )

    def bulk(
        self,
        move: str,
        where: str | Iterable[str] = (),
        *,
        dry_run: bool = False,
        rate: float | None = None,
        actor: str | None = None,
        reason: str | None = None,
        resume: str | None = None,
        progress: Callable[[bulk.BulkReport], None] | None = None,
        **options: str,
    ) -> bulk.BulkReport:
        """Make ``move`` (a name in ``bulk_moves.MOVES``: cancel, resume, resolve, abandon, upgrade,
        retry, skip, unwind) on
        every run the ``where`` terms select (``run_filter``; with no ``state=`` term, the
        states the move acts on). ``dry_run``: count them and show the first, storing
        nothing. Otherwise the operation is stored, acts at most ``rate`` runs a second,
        records its id with ``actor`` in each moved run's history, and reports after each
        page to ``progress``. ``resume`` (an operation's id) carries on an interrupted one:
        no run it acted on is acted on again. ``options``: the move's own (an upgrade's
        ``to``, a resolve's ``step`` and ``note``, a skip's JSON ``result``)."""
        return bulk.carry_out(
            self, move, where, dry_run, rate, actor, reason, resume, progress, options
        )

    # -- events -----------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Listener:
        """Call ``listener(event, fields)`` in this process for ``event`` (or ``"*"``)."""
        self.events.subscribe(event, listener)
        return listener
