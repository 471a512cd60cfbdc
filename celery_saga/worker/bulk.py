"""Many runs at once: one move applied to every run a filter selects (``engine.bulk``).

The moves a bulk operation can make are one registry, ``MOVES``: a new move is one
``BulkMove`` there (the states it acts on, and the engine call that makes it on one run).
An operation is stored (``store.bulk_operations``) before it acts; it walks the filter's
runs a page at a time (``store.run_selection``), at most ``rate`` moves a second, and
records its cursor after each page. Every move it makes records the operation's id in the
run's history, in the move's own transaction (``marked_actor``); before acting on a page
it asks which runs already have that row, so an operation interrupted anywhere (its
process killed, the store gone) and resumed (``resume=``) acts on each run at most once.
A store that cannot be reached makes it wait and retry, up to ``patience`` seconds.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.decisions.cancel import CANCELLABLE_STATES, CancelVerdict
from celery_saga.definition.builder import SagaDefinition
from celery_saga.errors import SagaError, StoreUnavailableError
from celery_saga.records import Execution, ExecutionState
from celery_saga.run_filter import FilterError, RunFilter, filter_from_text, parse_where
from celery_saga.runtime.clock import get_clock
from celery_saga.store import bulk_operations, run_selection
from celery_saga.store.bulk_operations import BulkOperation, marked_actor
from celery_saga.store.database import Database
from celery_saga.store.transient import is_transient
from celery_saga.typed_payload import parse_payload
from celery_saga.worker import held_moves, run_commands
from celery_saga.worker.arguments import check_actor, check_reason
from celery_saga.worker.parts import WorkerParts

logger = logging.getLogger("celery_saga")


class SagaEngine(Protocol):
    """What a bulk operation uses of the engine: its store, its parts (the moves on one run
    are ``run_commands``' and ``held_moves``' calls on them) and its upgrade."""

    db: Database
    parts: WorkerParts

    def get(self, execution_id: str) -> Execution: ...
    def upgrade(
        self, execution_id: str, to: str | None = None, *, actor: str | None = None
    ) -> SagaDefinition: ...


#: The engine call that makes a move on one run: (engine, run id, actor, reason, options)
#: -> True if it moved the run, False if the run needed nothing; raises its refusal.
Act = Callable[[SagaEngine, str, str, "str | None", Mapping[str, Any]], bool]

_LIVE = (ExecutionState.RUNNING, ExecutionState.WAITING, ExecutionState.HELD)
_PARKED = (ExecutionState.COMPENSATION_STUCK,)
_HELD = (ExecutionState.HELD,)


@dataclass(frozen=True)
class BulkMove:
    """A move a bulk operation can make: ``states``, the runs it acts on when the filter
    names no state, and ``act``, the engine's call on one run."""

    name: str
    states: tuple[ExecutionState, ...]
    act: Act
    #: The options it needs (``engine.bulk(..., step=..., note=...)``), checked before.
    needs: tuple[str, ...] = ()
    #: Options given as text that are read as a value (a skip's JSON ``result``): each is
    #: parsed before the operation is stored, so a bad one is refused with nothing stored.
    parsed: tuple[str, ...] = ()


def _moves_or_raises(
    call: Callable[[WorkerParts, str, str, str | None], object],
) -> Act:
    """A move whose call (``parts, run, actor, reason``) moves the run or raises."""

    def act(
        engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
    ) -> bool:
        call(engine.parts, run, actor, reason)
        return True

    return act


def _cancel(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    return run_commands.cancel_run(engine.parts, run, reason, actor) is CancelVerdict.CANCEL


def _resume(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    run_commands.resume_run(engine.parts, run, actor)
    return True


def _upgrade(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    engine.upgrade(run, options.get("to"), actor=actor)
    return True


def _resolve(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    run_commands.resolve_run(engine.parts, run, options["step"], options["note"], actor)
    return True


def _skip(
    engine: SagaEngine, run: str, actor: str, reason: str | None, options: Mapping[str, Any]
) -> bool:
    result = options.get("result")
    value = None if result is None else parse_payload(result)
    held_moves.skip_run(engine.parts, run, value, actor, reason)
    return True


#: Every move a bulk operation can make, by the name the CLI and ``engine.bulk`` take.
MOVES: dict[str, BulkMove] = {
    move.name: move
    for move in (
        BulkMove("cancel", CANCELLABLE_STATES, _cancel),
        BulkMove("resume", _PARKED, _resume),
        BulkMove("abandon", _PARKED, _moves_or_raises(run_commands.abandon_run)),
        BulkMove("upgrade", (*_LIVE, ExecutionState.COMPENSATING, *_PARKED), _upgrade),
        BulkMove("resolve", _PARKED, _resolve, needs=("step", "note")),
        BulkMove("retry", _HELD, _moves_or_raises(held_moves.retry_run)),
        BulkMove("skip", _HELD, _skip, parsed=("result",)),
        BulkMove("unwind", _HELD, _moves_or_raises(held_moves.unwind_run)),
    )
}


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


def bulk_move(name: str) -> BulkMove:
    move = MOVES.get(name)
    if move is None:
        raise SagaError(f"unknown bulk move {name!r:.40}; moves: {', '.join(MOVES)}")
    return move


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
        *,
        rate: float | None,
        progress: Callable[[BulkReport], None] | None,
        page_size: int = 100,
        patience: float = 300.0,
    ) -> None:
        self.engine, self.operation, self.rate = engine, operation, rate
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
        bulk_operations.advance(
            db,
            self.operation.id,
            cursor=page.cursor,
            acted=report.acted,
            refused=report.refused,
            now=get_clock().now(),
            finished=page.cursor is None,
        )
        self.cursor, report.finished = page.cursor, page.cursor is None
        self.moved.clear()
        if self.progress is not None:
            self.progress(report)

    def _act(self, run: str) -> None:
        self._pace()
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
        """At most ``rate`` moves a second, counted from the operation's start here."""
        if self.rate is None:
            return
        due = self._started + self._paced / self.rate
        self._paced += 1
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def start(
    engine: SagaEngine,
    move: str,
    where: str | Iterable[str] | RunFilter,
    *,
    actor: str | None,
    reason: str | None,
    options: Mapping[str, Any],
) -> BulkOperation:
    """Check and store a new operation (not started yet)."""
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
        created_at=get_clock().now(),
        finished_at=None,
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
    if resume is not None:
        operation = resumed(engine, resume)
    elif dry:
        return dry_run(engine, move, where)
    else:
        operation = start(engine, move, where, actor=actor, reason=reason, options=options)
    # One span for the operation; each run's move is a span of its trace, linked to it.
    named = {"saga.bulk_id": operation.id, "saga.move": operation.move}
    with engine.parts.tracer.operation("bulk", operation.actor, named):
        return BulkRun(engine, operation, rate=rate, progress=progress).run()
