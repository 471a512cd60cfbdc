"""``SagaEngine``: attaches sagas to an existing Celery app and is the Python API.

What it changes in Celery, it changes for its own app only, through ``celery_hooks``."""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from celery import Celery
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from celery_saga.decisions.cancel import CancelVerdict
from celery_saga.definition.builder import Saga, SagaDefinition, run_timeout
from celery_saga.definition.sub_sagas import check_no_cycle
from celery_saga.encryption import codec_from_conf
from celery_saga.errors import (
    DefinitionError,
    ExecutionNotFoundError,
    SagaError,
    StoreUnavailableError,
    UnknownSagaError,
)
from celery_saga.ids import new_execution_id
from celery_saga.limits import check_lookup_id, listed_saga_names, storable_cursor_id
from celery_saga.records import Execution, ExecutionState, RollbackStatus
from celery_saga.runtime import revocation, stopping
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.executor import Executor
from celery_saga.runtime.ports import Catalog, Settings
from celery_saga.runtime.recovery import Recoverer
from celery_saga.store import queries, retention
from celery_saga.store.codec import use_codec
from celery_saga.store.database import Database
from celery_saga.store.transient import describe_store_error, is_transient, retry_transient
from celery_saga.store.url_errors import configuration_error, quieted
from celery_saga.store.versions import waiting_for_version
from celery_saga.worker import arrivals, hand_back_notes, holders
from celery_saga.worker.arguments import check_age, enum_values
from celery_saga.worker.beat import install_beat_entries
from celery_saga.worker.celery_hooks import CeleryHooks
from celery_saga.worker.delivery import stopped_by_worker
from celery_saga.worker.discovery import Packages, SagaDiscovery
from celery_saga.worker.events import EventHub, Listener
from celery_saga.worker.hand_back import HandBacks
from celery_saga.worker.handle import SagaHandle
from celery_saga.worker.holders import CeleryHolders
from celery_saga.worker.publisher import CeleryPublisher
from celery_saga.worker.revocation import remember_worker_process, revoke_announced
from celery_saga.worker.run_commands import (
    abandon_run,
    adopt,
    cancel_run,
    check_actor,
    resume_run,
    signal_run,
)
from celery_saga.worker.start_checks import refuse_before_start
from celery_saga.worker.step_run import StepRun
from celery_saga.worker.step_tasks import StepTasks
from celery_saga.worker.tasks import register_tasks
from celery_saga.worker.versioning import VersionInfo, Versions

T = TypeVar("T")
DEFAULT_STORE_URL = "sqlite:///celery_saga.sqlite3"


class SagaEngine:
    """Attach saga support to ``app``.

    The store URL comes from ``store_url``, else the app's ``saga_store_url`` setting, else a
    SQLite file ``celery_saga.sqlite3`` in the working directory. Other settings:
    ``saga_lease_seconds``, ``saga_lease_margin``, ``saga_compensation_timeout``,
    ``saga_max_payload_bytes``, ``saga_recover_after``, ``saga_queue`` (queue for
    plain-function steps and the engine's own tasks), and the beat settings of
    `celery_saga.worker.beat`.
    """

    def __init__(self, app: Celery, *, store_url: str | None = None) -> None:
        self.app = app
        self.db = Database(
            store_url or app.conf.get("saga_store_url") or DEFAULT_STORE_URL,
            sqlite_synchronous=app.conf.get("saga_sqlite_synchronous") or "NORMAL",
        )
        if app.conf.get("saga_durable_claims"):
            self.db.durable_claims = True
        # Every payload this process stores or reads goes through the app's codec.
        use_codec(codec_from_conf(app.conf))
        self.events = EventHub(app)
        self.settings = Settings.from_conf(app.conf)
        self.catalog = Catalog(discover=lambda: self.discovery.discover())
        self.hooks = CeleryHooks(app, StepRun(self), self.events)
        self.discovery = SagaDiscovery(app, self.hooks.when_modules_imported)
        self.step_tasks = StepTasks(app, self.hooks)
        self.publisher = publisher = CeleryPublisher(
            app,
            # The hard limit must not kill a process that is still recording what its body
            # did through a store outage (guarantee 20): an outcome, then perhaps the park
            # of an unwind, each retried for that budget.
            hard_limit_grace=self.settings.hard_limit_grace
            + 2 * self.settings.outcome_retry_budget,
            compensation_timeout=self.settings.compensation_timeout,
            tasks=self.step_tasks,
        )
        # The holders ask through this engine's app and store, read when first asked.
        asker = CeleryHolders(self)
        self.executor = Executor(
            self.db, self.catalog, publisher, self.events, self.settings, asker
        )
        self.hooks.commands[holders.COMMAND] = functools.partial(holders.answer_holder, self)
        self.hooks.commands[holders.RUNS_COMMAND] = functools.partial(holders.answer_runs, self)
        self.hooks.on_pool_loss = functools.partial(holders.on_pool_loss, self)
        self.hooks.when_worker_starts(holders.PoolWatch(self).start)
        self.recoverer = Recoverer(self.executor)
        publisher.on_unsent = self.recoverer.owe_message
        register_tasks(app, self)
        install_beat_entries(app)
        self.versioning = Versions(self)
        self.hooks.when_worker_starts(self.versioning.announce)
        self.hand_backs = HandBacks(self)
        publisher.store = self.hand_backs.store
        self.hooks.task_handler = self.hand_backs.task_handler
        self.hooks.on_consumer_start = functools.partial(arrivals.announce, self)
        self.hooks.on_consumer_stop = self.hand_backs.let_go
        self.hooks.commands[hand_back_notes.COMMAND] = functools.partial(
            hand_back_notes.answer, self
        )
        self.hooks.commands[arrivals.COMMAND] = functools.partial(arrivals.answer, self)
        self.hooks.install()
        # A body cut short by this worker's shutdown is a lost attempt, not a failure.
        stopping.set_probe(stopped_by_worker)
        # A body its run's cancel stopped ends REVOKED only if its worker announced so.
        revocation.set_probe(revoke_announced)
        self.hooks.when_worker_starts(remember_worker_process)
        app.saga_engine = self

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
        self._store("migrating the saga store", self.db.migrate)

    def _store(self, what: str, call: Callable[[], T]) -> T:
        """Run a public call's store work, retried through connection failures for
        ``saga_store_retry_budget`` s; past it, ``StoreUnavailableError`` (guarantee 26). A
        store that refused the URL raises ``StoreConfigurationError`` at once."""
        budget = self.settings.store_retry_budget
        try:
            return retry_transient(call, budget=budget, what=what)
        except SQLAlchemyError as error:
            refused = configuration_error(error, self.db.url)
            if refused is not None:
                raise quieted(refused, error) from None
            if not is_transient(error):
                raise
            raise StoreUnavailableError(
                f"{what}: the saga store could not be reached within {budget:g} s "
                f"({describe_store_error(error)})"
            ) from error

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
    ) -> SagaHandle:
        """Start a run of the registered saga ``saga`` with ``input``; ``timeout`` (else the
        saga's own) cancels it when that much time has passed (guarantee 31)."""
        definition = self.definition(saga)
        seconds = run_timeout(f"starting saga {saga!r}", timeout)
        refuse_before_start(self.catalog, definition, execution_id)
        if input is not None and not isinstance(input, Mapping):
            raise SagaError(
                f"the input of saga {saga!r} must be a mapping (dict) of named values, "
                f"got {type(input).__name__}"
            )
        new_id = execution_id or new_execution_id()
        saga_input = {} if input is None else input
        self.ensure_schema()
        try:
            self._store(
                f"starting saga {saga!r}",
                lambda: self.executor.create(definition, saga_input, new_id, timeout=seconds),
            )
        except IntegrityError:
            adopt(self, definition, saga_input, new_id)
            return SagaHandle(self, new_id)
        self._launch(definition, new_id, announce=True)
        return SagaHandle(self, new_id)

    def _launch(self, definition: SagaDefinition, execution_id: str, announce: bool) -> None:
        # A first node that is a branch reads and journals its choice here: store work too.
        self._store(
            f"sending the first message of {execution_id!r}",
            lambda: self.executor.launch(definition, execution_id, announce=announce),
        )

    def handle(self, execution_id: str) -> SagaHandle:
        return SagaHandle(self, execution_id)

    def get(self, execution_id: str) -> Execution:
        check_lookup_id(execution_id)
        self.ensure_schema()
        record, steps = self._store(
            f"reading execution {execution_id!r}",
            lambda: queries.load_snapshot(self.db, execution_id),
        )
        if record is None or record.id != execution_id:  # MySQL finds 'a1' for 'A1 '
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        waits = self._store(
            "reading version waits", lambda: waiting_for_version(self.db, [record.id])
        )
        waiting = waits[record.id].definition_hash if record.id in waits else None
        return Execution(record, tuple(steps), waiting_for_version=waiting)

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
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise SagaError(f"limit must be an integer between 1 and 1000, got {limit!r}")
        after = None
        if cursor is not None:
            try:
                if not isinstance(cursor, str):
                    raise ValueError(cursor)
                stamp, last_id = queries.decode_cursor(cursor)
                after = (stamp, storable_cursor_id(last_id))
            except (ValueError, UnicodeDecodeError):
                raise SagaError(f"{cursor!r} is not a cursor returned by list()") from None
        names = listed_saga_names(saga)
        states = enum_values(ExecutionState, state, "state")
        rollback = enum_values(RollbackStatus, rollback_status, "rollback status")
        self.ensure_schema()
        return self._store(
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

    def _definition_of(self, execution_id: str) -> SagaDefinition:
        check_lookup_id(execution_id)
        self.ensure_schema()
        record = self._store(
            f"reading execution {execution_id!r}",
            lambda: queries.load_execution(self.db, execution_id),
        )
        if record is None or record.id != execution_id:  # MySQL finds 'a1' for 'A1 '
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        # The run's own version, never another: a process without it refuses, storing nothing.
        return self.catalog.for_run(record.saga_name, record.definition_hash, record.id)

    def resume_compensation(self, execution_id: str, *, actor: str | None = None) -> None:
        """Retry the failed reversal of a ``compensation_stuck`` run and continue the unwind
        (in a process without the run's version: on a worker that has it, see ``signal``).
        ``actor`` (who asks: an operator, a web user) is recorded in the run's history."""
        resume_run(self, execution_id, actor)

    def abandon_compensation(
        self, execution_id: str, *, actor: str | None = None, reason: str | None = None
    ) -> int:
        """Give up a parked unwind: outstanding steps are marked skipped and the run ends
        ``failed`` with ``rollback_status`` ``stuck``. Returns how many steps were skipped.
        ``actor`` and ``reason`` (who gave it up, and why) are recorded in its history."""
        return abandon_run(self, execution_id, actor, reason)

    def cancel(
        self, execution_id: str, reason: str | None = None, *, actor: str | None = None
    ) -> CancelVerdict:
        """Cancel a run wherever it stands: no step starts any more, the bodies in flight
        are stopped, and what it did is unwound; it ends ``cancelled`` (guarantee 31).
        Refused with ``InvalidStateError`` past its pivot or once ended; a run already
        cancelled or unwinding is left as it is (the verdict says which). ``actor`` is
        recorded in the run's history."""
        return cancel_run(self, execution_id, reason, actor)

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
        return signal_run(self, execution_id, event, payload, actor)

    def recover(self, stale_after: float | None = None, *, actor: str | None = None) -> int:
        """Run one recovery sweep now: republish the next message of every live run idle for
        ``stale_after`` seconds (default ``saga_recover_after``). Beat runs it on its own.
        ``actor`` (who ran it) is recorded in each recovered run's history."""
        check_actor(actor)
        self.ensure_schema()
        seconds = self.settings.recover_after if stale_after is None else stale_after
        return self._store(
            "the recovery sweep",
            lambda: self.recoverer.sweep(timedelta(seconds=seconds), actor=actor),
        )

    def fire_timers(self) -> int:
        """Fail (and unwind) every run whose ``wait_for`` deadline has passed, cancel every
        run past its own deadline, and send the messages a broker outage left owed; returns
        how many runs were acted on. Beat runs it every ``saga_timer_interval`` seconds."""
        self.ensure_schema()
        return self._store(
            "the timer sweep",
            lambda: (
                self.executor.fire_timers()
                + self.executor.cancel_overdue()
                + self.recoverer.send_owed()
            ),
        )

    def cleanup(self, older_than: float | timedelta, *, budget: float | None = None) -> int:
        """Delete terminal runs not updated for ``older_than`` (inclusive), with their child
        runs; parked or waiting runs are never touched. Returns how many runs went. With
        ``budget`` (seconds) it stops after the batch that passes it; the next call goes on."""
        return self._retire(older_than, archive=False, budget=budget)

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
        check_actor(actor)
        return self._retire(older_than, archive=True, budget=budget, actor=actor)

    def _retire(
        self,
        older_than: float | timedelta,
        archive: bool,
        budget: float | None,
        actor: str | None = None,
    ) -> int:
        age = check_age(older_than, "archive(older_than)" if archive else "cleanup(older_than)")
        self.ensure_schema()
        now = get_clock().now()
        return self._store(
            "archiving" if archive else "cleaning up",
            lambda: retention.retire(
                self.db, cutoff=now - age, now=now, archive=archive, budget=budget, actor=actor
            ),
        )

    def versions(self) -> builtins.list[VersionInfo]:
        """Every version of every saga: registered here, seen on workers, or with live runs."""
        return self._store("listing versions", self.versioning.report)

    def upgrade(
        self, execution_id: str, to: str | None = None, *, actor: str | None = None
    ) -> SagaDefinition:
        """Move a run to version ``to`` (hash or label; default: the newest registered here);
        ``UpgradeRefusedError`` naming the first node that differs, nothing stored."""
        check_actor(actor)
        return self._store(
            f"upgrading {execution_id!r}", lambda: self.versioning.upgrade(execution_id, to, actor)
        )

    # -- events -----------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Listener:
        """Call ``listener(event, fields)`` in this process for ``event`` (or ``"*"``)."""
        self.events.subscribe(event, listener)
        return listener
