"""``SagaEngine``: attaches sagas to an existing Celery app and is the Python API."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from celery import Celery
from sqlalchemy.exc import IntegrityError

from celery_saga.definition.builder import Saga, SagaDefinition
from celery_saga.errors import (
    DefinitionError,
    ExecutionNotFoundError,
    SagaError,
    UnknownSagaError,
)
from celery_saga.records import Execution, ExecutionState, RollbackStatus
from celery_saga.runtime.clock import get_clock
from celery_saga.runtime.executor import Executor
from celery_saga.runtime.ports import Catalog, Settings
from celery_saga.runtime.recovery import Recoverer
from celery_saga.store import queries, retention
from celery_saga.store.database import Database
from celery_saga.worker.beat import install_beat_entries, request_sweep_when_ready
from celery_saga.worker.events import EventHub, Listener
from celery_saga.worker.publisher import CeleryPublisher
from celery_saga.worker.tasks import register_tasks

DEFAULT_STORE_URL = "sqlite:///celery_saga.sqlite3"
#: States in which a run does nothing more until someone acts: done, or waiting for a
#: signal or an operator.
SETTLED_STATES = (
    ExecutionState.COMPLETED,
    ExecutionState.FAILED,
    ExecutionState.COMPENSATION_STUCK,
    ExecutionState.WAITING,
)


def _settings_from(app: Celery) -> Settings:
    conf, defaults = app.conf, Settings()
    return Settings(
        lease_seconds=float(conf.get("saga_lease_seconds") or defaults.lease_seconds),
        compensation_timeout=float(
            conf.get("saga_compensation_timeout") or defaults.compensation_timeout
        ),
        max_payload_bytes=int(conf.get("saga_max_payload_bytes") or defaults.max_payload_bytes),
        lease_margin=float(conf.get("saga_lease_margin") or defaults.lease_margin),
        recover_after=float(conf.get("saga_recover_after") or defaults.recover_after),
    )


def _age(value: float | timedelta, what: str) -> timedelta:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise SagaError(f"{what} must be a number of seconds >= 0 or a timedelta, got {value!r}")
    return timedelta(seconds=seconds)


def _enum_values(kind: type[Any], values: Any, what: str) -> list[Any]:
    if values is None:
        return []
    items = [values] if isinstance(values, (str, kind)) else list(values)
    try:
        return [kind(v) for v in items]
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise SagaError(f"unknown {what} in {items!r}; expected one of: {allowed}") from None


class SagaHandle:
    """A started execution: its id, and helpers to read it or block until it settles."""

    def __init__(self, engine: SagaEngine, execution_id: str) -> None:
        self.engine, self.id = engine, execution_id

    def get(self) -> Execution:
        return self.engine.get(self.id)

    def wait(
        self,
        timeout: float = 30.0,
        interval: float = 0.05,
        states: Iterable[ExecutionState] = SETTLED_STATES,
    ) -> Execution:
        """Poll until the run is in one of ``states`` (default: completed, failed, parked
        as compensation_stuck, or waiting for a signal); for scripts and tests."""
        wanted = tuple(states)
        deadline = time.monotonic() + timeout
        while True:
            execution = self.get()
            if execution.state in wanted:
                return execution
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"execution {self.id!r} still {execution.state.value} after {timeout:g}s"
                )
            time.sleep(interval)

    def __repr__(self) -> str:
        return f"SagaHandle({self.id!r})"


class SagaEngine:
    """Attach saga support to ``app``.

    The store URL comes from ``store_url``, else the app's ``saga_store_url`` setting, else a
    SQLite file ``celery_saga.sqlite3`` in the working directory. Other settings:
    ``saga_lease_seconds``, ``saga_lease_margin``, ``saga_compensation_timeout``,
    ``saga_max_payload_bytes``, ``saga_recover_after``, ``saga_queue`` (queue for
    plain-function steps and the engine's own tasks), and the beat settings of
    :mod:`celery_saga.worker.beat`.
    """

    def __init__(self, app: Celery, *, store_url: str | None = None) -> None:
        self.app = app
        self.db = Database(store_url or app.conf.get("saga_store_url") or DEFAULT_STORE_URL)
        self.events = EventHub(app)
        self.settings = _settings_from(app)
        self.catalog = Catalog()
        self.executor = Executor(
            self.db, self.catalog, CeleryPublisher(app), self.events, self.settings
        )
        self.recoverer = Recoverer(self.executor)
        register_tasks(app, self)
        install_beat_entries(app)
        request_sweep_when_ready(app)
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
        self.db.migrate()

    def register(self, *sagas: Saga) -> list[SagaDefinition]:
        """Seal and register definitions; re-registering an identical one is a no-op."""
        for saga in sagas:
            if not isinstance(saga, Saga):
                raise DefinitionError(
                    f"register() takes Saga builders, got {saga!r} ({type(saga).__name__})"
                )
        sealed = [saga.seal() for saga in sagas]
        for definition in sealed:
            known = self.catalog(definition.name)
            if known is not None and known.hash != definition.hash:
                raise DefinitionError(
                    f"a different saga named {definition.name!r} is already registered"
                )
        for definition in sealed:
            self.catalog.add(definition)
        return sealed

    def definition(self, name: str) -> SagaDefinition:
        definition = self.catalog(name)
        if definition is None:
            known = ", ".join(self.catalog.names()) or "none"
            raise UnknownSagaError(f"no saga named {name!r} is registered (known: {known})")
        return definition

    # -- running ----------------------------------------------------------------------
    def start(self, saga: str, input: Any = None, *, execution_id: str | None = None) -> SagaHandle:
        """Start a run of the registered saga ``saga`` with ``input``."""
        definition = self.definition(saga)
        if input is not None and not isinstance(input, Mapping):
            raise SagaError(
                f"the input of saga {saga!r} must be a mapping (dict) of named values, "
                f"got {type(input).__name__}"
            )
        if execution_id is not None and (
            not isinstance(execution_id, str)
            or ":" in execution_id
            or not 0 < len(execution_id) <= 64
        ):
            # No colon: it leads every idempotency key, which must parse unambiguously.
            raise SagaError(
                "execution_id must be a string of 1-64 characters without ':', "
                f"got {execution_id!r}"
            )
        new_id = execution_id or str(uuid.uuid4())
        self.ensure_schema()
        try:
            self.executor.start(definition, {} if input is None else input, new_id)
        except IntegrityError:
            raise SagaError(f"an execution with id {new_id!r} already exists") from None
        return SagaHandle(self, new_id)

    def handle(self, execution_id: str) -> SagaHandle:
        return SagaHandle(self, execution_id)

    def get(self, execution_id: str) -> Execution:
        self.ensure_schema()
        record, steps = queries.load_snapshot(self.db, execution_id)
        if record is None:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        return Execution(record, tuple(steps))

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
                after = queries.decode_cursor(cursor)
            except (ValueError, UnicodeDecodeError):
                raise SagaError(f"{cursor!r} is not a cursor returned by list()") from None
        names = [saga] if isinstance(saga, str) else list(saga or [])
        self.ensure_schema()
        return queries.list_executions(
            self.db,
            saga_names=names,
            states=_enum_values(ExecutionState, state, "state"),
            rollback_statuses=_enum_values(RollbackStatus, rollback_status, "rollback status"),
            after=after,
            limit=limit,
        )

    def _definition_of(self, execution_id: str) -> SagaDefinition:
        self.ensure_schema()
        record = queries.load_execution(self.db, execution_id)
        if record is None:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        return self.definition(record.saga_name)

    def resume_compensation(self, execution_id: str) -> None:
        """Retry the failed reversal of a ``compensation_stuck`` run and continue the unwind."""
        self.executor.unwinder.resume(self._definition_of(execution_id), execution_id)

    def abandon_compensation(self, execution_id: str) -> int:
        """Give up a parked unwind: outstanding steps are marked skipped and the run ends
        ``failed`` with rollback ``stuck``. Returns how many steps were skipped."""
        return self.executor.unwinder.abandon(self._definition_of(execution_id), execution_id)

    def signal(self, execution_id: str, event: str, payload: Any = None) -> bool:
        """Deliver ``event`` (with an optional storable ``payload``) to a run.

        Recorded once per (execution, event): a second signal raises
        ``DuplicateSignalError``; one to an unknown run ``ExecutionNotFoundError``, to a run
        that is not running or waiting ``InvalidStateError``, for an event its saga does not
        wait for ``UnknownEventError``; none of them stores anything. Returns True if this
        signal resumed the run (parked at that gate), False if it waits for the run to get
        there.
        """
        if not isinstance(event, str) or not event:
            raise SagaError(f"a signal needs an event name, got {event!r}")
        definition = self._definition_of(execution_id)
        return self.executor.waits.signal(definition, execution_id, event, payload)

    def recover(self, stale_after: float | None = None) -> int:
        """Run one recovery sweep now: republish the next message of every live run idle for
        ``stale_after`` seconds (default ``saga_recover_after``). Beat runs it on its own."""
        self.ensure_schema()
        seconds = self.settings.recover_after if stale_after is None else stale_after
        return self.recoverer.sweep(timedelta(seconds=seconds))

    def fire_timers(self) -> int:
        """Fail (and unwind) every run whose ``wait_for`` deadline has passed; returns how
        many were acted on. Beat runs it every ``saga_timer_interval`` seconds."""
        self.ensure_schema()
        return self.executor.waits.fire_expired()

    def cleanup(self, older_than: float | timedelta) -> int:
        """Delete terminal runs not updated for ``older_than`` (inclusive), with their child
        runs; parked or waiting runs are never touched. Returns how many runs went."""
        return self._retire(older_than, archive=False)

    def archive(self, older_than: float | timedelta) -> int:
        """Move terminal runs not updated for ``older_than`` (inclusive) into the
        ``saga_*_archive`` tables, as ``cleanup`` would delete them."""
        return self._retire(older_than, archive=True)

    def _retire(self, older_than: float | timedelta, archive: bool) -> int:
        age = _age(older_than, "archive(older_than)" if archive else "cleanup(older_than)")
        self.ensure_schema()
        now = get_clock().now()
        return retention.retire(self.db, cutoff=now - age, now=now, archive=archive)

    # -- events -----------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Listener:
        """Call ``listener(event, fields)`` in this process for ``event`` (or ``"*"``)."""
        self.events.subscribe(event, listener)
        return listener
