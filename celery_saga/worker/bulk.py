"""Many runs at once: one move applied to every run a filter selects (``engine.bulk``).

The moves a bulk operation can make are one registry, ``bulk_moves.MOVES``. An
operation is stored (``store.bulk_operations``) before it acts; it walks the filter's
runs a page at a time (``store.run_selection``), at most ``rate`` moves a second, and
records its cursor after each page. Every move it makes records the operation's id in the
run's history, in the move's own transaction (``marked_actor``); before acting on a page
it asks which runs already have that row, so an operation interrupted anywhere (its
process killed, the store gone) and resumed (``resume=``) acts on each run at most once.
A store that cannot be reached makes it wait and retry, up to ``patience`` seconds. One
process at a time carries an operation out (``bulk_lease``): a resume while another
process still works on it is refused, and a process whose operation was taken over stops
before its next move.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.errors import SagaError, StoreUnavailableError
from celery_saga.run_filter import FilterError, RunFilter, filter_from_text, parse_where
from celery_saga.runtime.clock import get_clock
from celery_saga.store import bulk_operations, run_selection
from celery_saga.store.bulk_operations import BulkOperation, marked_actor
from celery_saga.store.transient import is_transient
from celery_saga.typed_payload import parse_payload
from celery_saga.worker.arguments import check_actor, check_reason
from celery_saga.worker.bulk_lease import LEASE, OperationLease, this_process
from celery_saga.worker.bulk_moves import BulkMove, SagaEngine, bulk_move

logger = logging.getLogger("celery_saga")


@dataclass
class BulkReport:
    """What an operation did so far (a dry run: what it would act on)."""

    move: str
    #: None for a dry run, which stores nothing.
    operation_id: str | None
    dry_run: bool = False
    #: A dry run: how many runs the filter selects now.
    matched: int = 0
    #: The first runs it selects (a dry run), as ``(id, saga, state)``.
    sample: list[tuple[str, str, str]] = field(default_factory=list)
    acted: int = 0
    #: Runs the move refused (their state, their pivot) or that needed nothing.
    refused: int = 0
    #: Runs this operation had acted on before it was interrupted.
    already: int = 0
    finished: bool = False


def check_rate(rate: object) -> None:
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0
    ):
        raise SagaError(f"rate is a number of runs per second > 0, got {rate!r:.40}")


def _filter_for(move: BulkMove, where: str | Iterable[str] | RunFilter) -> RunFilter:
    if isinstance(where, RunFilter):
        run_filter = where
    else:
        run_filter = parse_where([where] if isinstance(where, str) else where)
    if run_filter.is_empty:
        raise FilterError(
            f"a bulk {move.name} needs at least one --where term (every run is never meant)"
        )
    if not run_filter.states:
        run_filter = replace(run_filter, states=move.states)
    return run_filter


class BulkRun:
    """One operation being carried out (see the module's docstring)."""

    def __init__(
        self,
        engine: SagaEngine,
        operation: BulkOperation,
        lease: OperationLease,
        *,
        rate: float | None,
        progress: Callable[[BulkReport], None] | None,
        page_size: int = 100,
        patience: float = 300.0,
    ) -> None:
        self.engine, self.operation, self.lease, self.rate = engine, operation, lease, rate
        self.move = bulk_move(operation.move)
        self.filter = _filter_for(self.move, filter_from_text(operation.filter))
        self.progress, self.page_size, self.patience = progress, page_size, patience
        self.actor = marked_actor(operation.actor, operation.id)
        self.report = BulkReport(
            operation.move, operation.id, acted=operation.acted, refused=operation.refused
        )
        self.cursor = operation.cursor
        #: Runs of the page in hand this process moved (kept across a retried page).
        self.moved: set[str] = set()
        #: A run whose move met a store outage: it may have moved and left the filter.
        self.unsure: str | None = None
        self._started, self._paced = time.monotonic(), 0

    def run(self) -> BulkReport:
        waited_since: float | None = None
        if self.progress is not None:
            self.progress(self.report)
        while not self.report.finished:
            try:
                self._page()
                waited_since = None
            except (StoreUnavailableError, SQLAlchemyError) as error:
                if isinstance(error, SQLAlchemyError) and not is_transient(error):
                    raise
                waited_since = waited_since or time.monotonic()
                if time.monotonic() - waited_since > self.patience:
                    raise
                logger.warning(
                    "bulk %s %s: the store could not be reached (%s); waiting to go on",
                    self.move.name,
                    self.operation.id,
                    type(error).__name__,
                )
                time.sleep(1.0)
        report = self.report
        logger.info(
            "bulk %s %s finished: %d acted on, %d refused or unchanged, %d already acted on",
            self.move.name,
            self.operation.id,
            report.acted,
            report.refused,
            report.already,
        )
        return report

    def _page(self) -> None:
        self.lease.keep()
        db, now = self.engine.db, get_clock().now()
        if self.unsure is not None:  # its reply lost: its history row says if it moved
            unsure = self.unsure
            if bulk_operations.acted_on(db, [unsure], self.operation.id, self.operation.actor):
                self._moved(unsure)
            self.unsure = None
        page = run_selection.select_page(
            db, self.filter, now=now, after=self.cursor, limit=self.page_size
        )
        done = bulk_operations.acted_on(db, page.ids, self.operation.id, self.operation.actor)
        for run in page.ids:
            if run in done:
                self.report.already += run not in self.moved
                continue
            self._act(run)
        report = self.report
        if not bulk_operations.advance(
            db,
            self.operation.id,
            self.lease.name,
            cursor=page.cursor,
            acted=report.acted,
            refused=report.refused,
            now=get_clock().now(),
            finished=page.cursor is None,
        ):
            raise self.lease.lost()
        self.cursor, report.finished = page.cursor, page.cursor is None
        self.moved.clear()
        if self.progress is not None:
            self.progress(report)

    def _act(self, run: str) -> None:
        self._pace()
        self.lease.keep()  # raises before the move if another process took over
        options = self.operation.options
        try:
            moved = self.move.act(self.engine, run, self.actor, self.operation.reason, options)
        except StoreUnavailableError:
            self.unsure = run
            raise
        except SagaError as error:
            self._settle(run, False, error)
            return
        self._settle(run, moved, None)

    def _settle(self, run: str, moved: bool, error: SagaError | None) -> None:
        """Count ``run`` acted on or refused. A move whose commit's reply was lost is
        refused, or finds nothing to do, when tried again: its history row says it moved."""
        if moved or bulk_operations.acted_on(
            self.engine.db, [run], self.operation.id, self.operation.actor
        ):
            self._moved(run)
            return
        self.report.refused += 1
        if error is not None:
            logger.info("bulk %s %s: %s refused: %s", self.move.name, self.operation.id, run, error)

    def _moved(self, run: str) -> None:
        self.moved.add(run)
        self.report.acted += 1

    def _pace(self) -> None:
        """At most ``rate`` moves a second, counted from the operation's start here; the
        hold renewed while it waits (a slow rate waits longer than a lease)."""
        if self.rate is None:
            return
        due = self._started + self._paced / self.rate
        self._paced += 1
        while (delay := due - time.monotonic()) > 0:
            time.sleep(min(delay, LEASE.total_seconds() / 6))
            self.lease.keep()


def start(
    engine: SagaEngine,
    move: str,
    where: str | Iterable[str] | RunFilter,
    *,
    actor: str | None,
    reason: str | None,
    options: Mapping[str, Any],
    holder: str | None = None,
) -> BulkOperation:
    """Check and store a new operation (not started yet), held by ``holder``."""
    chosen = bulk_move(move)
    run_filter = _filter_for(chosen, where)
    check_actor(actor)
    check_reason(reason, f"a bulk {move} reason")
    missing = [name for name in chosen.needs if options.get(name) is None]
    if missing:
        raise SagaError(f"a bulk {move} needs {' and '.join(missing)}")
    for name, value in options.items():
        check_reason(value, f"the {name} of a bulk {move}")
    for name in chosen.parsed:
        if options.get(name) is not None:
            parse_payload(options[name])
    now = get_clock().now()
    operation = BulkOperation(
        id=f"bulk-{uuid.uuid4().hex[:12]}",
        move=chosen.name,
        filter=parse_where(run_filter.terms).text(),
        options=dict(options),
        actor=actor,
        reason=reason,
        cursor=None,
        acted=0,
        refused=0,
        created_at=now,
        finished_at=None,
        holder=holder,
        lease_until=now + LEASE if holder else None,
    )
    engine.parts.store.run(
        f"storing bulk operation {operation.id}",
        lambda: bulk_operations.create(engine.db, operation),
    )
    logger.info(
        "bulk %s %s stored by %s: where %s", move, operation.id, actor, " ".join(run_filter.terms)
    )
    return operation


def resumed(engine: SagaEngine, operation_id: str) -> BulkOperation:
    """A stored operation to carry on; refused once finished."""
    operation = engine.parts.store.run(
        f"reading bulk operation {operation_id!r:.80}",
        lambda: bulk_operations.load(engine.db, operation_id),
    )
    if operation.finished_at is not None:
        raise SagaError(
            f"bulk operation {operation_id} finished at {operation.finished_at:%Y-%m-%d %H:%M:%S}"
            f" ({operation.acted} run(s) acted on); there is nothing left to resume"
        )
    return operation


def dry_run(
    engine: SagaEngine, move: str, where: str | Iterable[str] | RunFilter, sample: int = 10
) -> BulkReport:
    """What a bulk ``move`` would act on now: how many runs, and the first ``sample``."""
    chosen = bulk_move(move)
    run_filter = _filter_for(chosen, where)
    db, now = engine.db, get_clock().now()

    def read() -> BulkReport:
        count = run_selection.count(db, run_filter, now=now)
        page = run_selection.select_page(db, run_filter, now=now, after=None, limit=sample)
        report = BulkReport(chosen.name, None, dry_run=True, matched=count)
        for run in page.ids:
            record = engine.get(run).record
            report.sample.append((run, record.saga_name, record.state.value))
        return report

    return engine.parts.store.run(f"counting the runs of a bulk {move}", read)


def carry_out(
    engine: SagaEngine,
    move: str,
    where: str | Iterable[str],
    dry: bool,
    rate: float | None,
    actor: str | None,
    reason: str | None,
    resume: str | None,
    progress: Callable[[BulkReport], None] | None,
    options: Mapping[str, Any],
) -> BulkReport:
    """``engine.bulk`` (its arguments in its order): a dry run's count, or a new (or
    resumed) operation carried out."""
    check_rate(rate)
    engine.parts.store.ensure_schema()
    here = this_process()
    if resume is not None:
        operation = resumed(engine, resume)
        lease = OperationLease(engine.db, operation.id, here)
        engine.parts.store.run(f"taking bulk operation {resume}", lambda: lease.take(operation))
    elif dry:
        return dry_run(engine, move, where)
    else:
        operation = start(
            engine, move, where, actor=actor, reason=reason, options=options, holder=str(here)
        )
        lease = OperationLease(engine.db, operation.id, here)
    # One span for the operation; each run's move is a span of its trace, linked to it.
    named = {"saga.bulk_id": operation.id, "saga.move": operation.move}
    try:
        with engine.parts.tracer.operation("bulk", operation.actor, named):
            return BulkRun(engine, operation, lease, rate=rate, progress=progress).run()
    except BaseException:
        lease.let_go()  # stopped on an error (or Ctrl-C): another process may resume it now
        raise
