"""The read API: what every view asks of the store, as the read model's values. ``celery
saga list/show/stats``, the web view and the Django admin read through it and nothing else;
``SagaEngine.inspect()`` hands one out for users' own dashboards. Nothing here writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from celery_saga.decisions.plan import PLANNERS, LoadedRun, Plan
from celery_saga.decisions.versions import VersionRef, find_version
from celery_saga.definition.run_markings import run_markings
from celery_saga.errors import ExecutionNotFoundError, SagaError
from celery_saga.inspect import story, waiting
from celery_saga.inspect.redacted import redacted
from celery_saga.inspect.values import ListedRun, RunList, RunView
from celery_saga.records import ExecutionRecord, ExecutionState, KeyLoad
from celery_saga.runtime.catalog import Catalog
from celery_saga.store import flow, inspection, queries, step_lines
from celery_saga.store.database import Database
from celery_saga.store.inspection import Filters, Stats, StoredRun
from celery_saga.store.replica import ReplicaLag, reads, replica_lag
from celery_saga.store.versions import waiting_for_version


class Inspector:
    """Reads runs as the read model. ``db``: the store; ``catalog``: the definitions this
    process has (graphs, markings); ``versions``: the versions known here, with runs or on a
    worker (``saga versions``); ``prepare``: called before each read (creates the tables
    of an embedded store on first use)."""

    def __init__(
        self,
        db: Database,
        catalog: Catalog,
        versions: Callable[[], Sequence[VersionRef]],
        prepare: Callable[[], None] = lambda: None,
    ) -> None:
        self._db, self._catalog, self._versions, self._prepare = db, catalog, versions, prepare

    def run(self, execution_id: str, *, reveal: bool = False, fresh: bool = False) -> RunView:
        """One run with its child runs, its graph and timeline; what its saga marks
        sensitive redacted unless ``reveal``; ``fresh``: read from the store even when it
        has a read replica (for a verb about to act on the run). Raises
        ``ExecutionNotFoundError``."""
        found = self.find_run(execution_id, reveal=reveal, fresh=fresh)
        if found is None:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        return found

    def find_run(
        self, execution_id: str, *, reveal: bool = False, fresh: bool = False
    ) -> RunView | None:
        """``run``, or None for a run that is not stored (any more)."""
        self._prepare()
        stored = self._load(execution_id, reveal, fresh)
        if stored is None:
            return None
        db = self._db if fresh else reads(self._db)
        waits = waiting_for_version(db, [execution_id]) if stored.archived_at is None else {}
        version = waits[execution_id].definition_hash if execution_id in waits else None
        queued = stored.record.state is ExecutionState.QUEUED and stored.archived_at is None
        running = stored.record.state is ExecutionState.RUNNING and stored.archived_at is None
        doors = step_lines.door_places(db, execution_id) if running else []
        return story.describe(
            stored,
            lambda child: self._load(child, reveal, fresh),
            self._catalog,
            waiting_for_version=version,
            queued_behind=flow.queue_place(db, execution_id) if queued else None,
            at_door=doors[0] if doors else None,
        )

    def plan(self, execution_id: str, move: str = "unwind", step: str | None = None) -> Plan:
        """What ``move`` (a name in ``decisions.plan.PLANNERS``) would do to the run now,
        read from the store itself (not a replica); payloads redacted where marked."""
        if move not in PLANNERS:
            raise SagaError(f"no plan for move {move!r}; moves: {', '.join(PLANNERS)}")
        self._prepare()
        record, steps = queries.load_snapshot(self._db, execution_id)
        if record is None or record.id != execution_id:
            raise ExecutionNotFoundError(f"no saga execution with id {execution_id!r}")
        saga, version = record.saga_name, record.definition_hash
        definition = self._catalog.known(saga, version)
        marks = run_markings(self._catalog, saga, version)
        return PLANNERS[move](LoadedRun(record, tuple(steps), definition, marks), step)

    def _load(self, execution_id: str, reveal: bool, fresh: bool = False) -> StoredRun | None:
        stored = inspection.load_run(self._db, execution_id, fresh=fresh)
        if stored is None or reveal:
            return stored
        return redacted(stored, self._catalog)

    def runs(
        self,
        filters: Filters | None = None,
        *,
        archived: bool = False,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> RunList:
        """One page of runs, oldest first (``newest_first``: the other way), each with its
        reason column. Raises ``SagaError`` for a cursor no list handed out."""
        self._prepare()
        try:
            page = inspection.list_runs(
                self._db,
                filters or Filters(),
                archived=archived,
                limit=limit,
                cursor=cursor,
                newest_first=newest_first,
            )
        except (ValueError, UnicodeDecodeError):
            raise SagaError(f"{cursor!r} is not a cursor of a list of runs") from None
        return RunList(self._listed(page.items, archived), page.next_cursor)

    def _listed(self, records: Sequence[ExecutionRecord], archived: bool) -> tuple[ListedRun, ...]:
        """Each run's reason column: one read for the page's version waits, the rest from
        the definitions."""
        ids = [r.id for r in records]
        waits = {} if archived else waiting_for_version(reads(self._db), ids)
        listed = []
        for record in records:
            version = waits[record.id].definition_hash if record.id in waits else None
            definition = self._catalog(record.saga_name, record.definition_hash)
            event = story.gate_event(definition, record)
            reason = waiting.listed(
                record,
                event=event,
                version=version,
                child=waiting.awaited_child(self._catalog, record),
            )
            listed.append(ListedRun(record, reason, event, version))
        return tuple(listed)

    def listed(self, record: ExecutionRecord | None) -> ListedRun | None:
        """``record`` as a list shows it (``stats``' oldest runs)."""
        return None if record is None else self._listed([record], False)[0]

    def limits(self, most: int = 20) -> list[KeyLoad]:
        """The busiest flow-control keys: most runs queued, then most live (``saga limits``);
        then the busiest keys of limited steps (``kind`` "step"), each with its limit as
        the deployed definition of one of its waiting steps says (0: a rate, or unknown)."""
        self._prepare()
        found = flow.busiest_keys(reads(self._db), most)
        for load, (saga, version, record) in step_lines.busiest_lines(reads(self._db), most):
            definition = self._catalog.known(saga, version)
            spec = definition.find_step(record) if definition else None
            limit = spec.concurrency.max if spec and spec.concurrency else 0
            found.append(replace(load, limit=limit))
        return found

    def counts(self) -> dict[str, int]:
        """Unfinished runs by state, read from the index on state."""
        self._prepare()
        by_state: dict[str, int] = {}
        for (_, state), number in inspection.run_counts(self._db).items():
            by_state[state] = by_state.get(state, 0) + number
        return by_state

    def parked(self, limit: int = 50) -> RunList:
        """The parked runs (compensation_stuck), oldest first."""
        return self.runs(Filters(states=[ExecutionState.COMPENSATION_STUCK]), limit=limit)

    def stats(self, *, complete: bool = False) -> Stats:
        """Counts of unfinished runs by saga and state (all runs, archived too, with
        ``complete``: reads the whole history), and the oldest waiting and parked runs."""
        self._prepare()
        return inspection.stats(self._db, complete=complete)

    def lag(self) -> ReplicaLag:
        """How far behind the store the reads above may be (``saga_read_store_url``): a
        view says so when it is worth saying (``ReplicaLag.worth_saying``)."""
        return replica_lag(self._db)

    def version_hashes(self, named: Sequence[str]) -> list[str]:
        """The hash of each version in ``named`` (a hash, a prefix or a label), among the
        versions known here; a name none of them answers to is refused."""
        if not named:
            return []
        known = list(self._versions())
        hashes = []
        for name in named:
            found = find_version(name, known)
            if found is None:
                raise SagaError(
                    f"no version {name!r} is known (see `saga versions` for hashes and labels)"
                )
            hashes.append(found.hash)
        return hashes
