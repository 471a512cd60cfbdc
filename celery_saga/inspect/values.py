"""The read model: one run as frozen values (its steps, reversals, signals, history, graph
and timeline), built from the store's typed records by ``inspect.story`` and rendered alike
by ``celery saga show``, the web view and the Django admin. Nothing here reads the store.

Statuses are the words of ``inspect.vocabulary``; times are aware datetimes (UTC)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_saga.records import ExecutionRecord
from celery_saga.store.history import HistoryEntry
from celery_saga.store.inspection import Signal
from celery_saga.tracing.spans import trace_id_of

#: One history row as stored (``store.history``): what happened, to which step, by whom.
HistoryRow = HistoryEntry

#: A signal the run received, as stored (``store.inspection``): ``event``, ``payload``,
#: ``received_at``.
SignalView = Signal


@dataclass(frozen=True)
class Within:
    """The group a step ran in: ``kind`` parallel, branch, loop, for_each or sub_saga."""

    kind: str
    name: str


@dataclass(frozen=True)
class ReversalView:
    """A step's reversal. ``status``: its outcome (compensated, compensation_failed,
    compensation_skipped, compensation_resolved), None while under way; ``attempts`` since
    the last resume, ``total_attempts`` across resumes; ``holder``: the worker process
    holding its claim."""

    status: str | None
    reason: str | None
    attempts: int
    total_attempts: int
    at: datetime | None
    holder: str | None


@dataclass(frozen=True)
class MissingChild:
    """A child run that is not stored any more (or lies deeper than ``story.MAX_DEPTH``)."""

    id: str
    missing: bool = True


@dataclass(frozen=True)
class StepView:
    """One step record: ``name`` with its iteration (``pack:2``), ``step`` without it;
    ``status`` the step's own (a ``StepStatus`` value); ``holder`` the worker process
    holding its claim while it runs; ``child`` the run a sub-saga node started."""

    name: str
    step: str
    iteration: int | None
    node: int
    within: Within | None
    status: str
    attempts: int
    idempotency_key: str
    started_at: datetime | None
    completed_at: datetime | None
    error: str | None
    result: Any
    holder: str | None
    compensatable: bool
    compensation: ReversalView | None
    child: RunView | MissingChild | None


@dataclass(frozen=True)
class GraphNode:
    """One node of a run's definition (or a member of a group), with the status its records
    give it. ``kind``: step, parallel, branch, loop, for_each, wait, pivot or sub_saga;
    ``status``: a word of ``vocabulary`` (a step's reads ``completed -> compensated`` once
    reversed: ``forward`` and ``reversal`` hold the two halves); ``children``: a group's
    members, a branch's taken path, a sub-saga's child run's nodes; ``link``: that child
    run's id; ``iterations``: how many records a step has (a loop's body runs several)."""

    kind: str
    name: str
    status: str
    detail: str | None = None
    children: tuple[GraphNode, ...] = ()
    link: str | None = None
    iterations: int = 0
    forward: str | None = None
    reversal: str | None = None

    @property
    def outcome(self) -> str:
        """The one word a colour follows: the reversal's outcome once there is one."""
        return self.reversal or self.status

    @property
    def side_by_side(self) -> bool:
        return self.kind == "parallel"


@dataclass(frozen=True)
class TimelineEntry:
    """One dated thing that happened to a run, in time order: ``kind`` (a history row's
    kind, ``start``, a step's status, ...), ``text`` as ``show`` prints it, ``took`` how
    long its span lasted, ``depth`` how many child runs down it happened."""

    at: datetime
    kind: str
    text: str
    offset_ms: float = 0.0
    step: str | None = None
    took: str | None = None
    actor: str | None = None
    history_id: int | None = None
    depth: int = 0


@dataclass(frozen=True)
class TimelineBar:
    """One attempt of a step or of its reversal, for a picture on a time axis: ``direction``
    ``forward`` or ``reversal``; ``outcome`` how the attempt ended (completed, failed,
    retrying, lost, released, compensated, compensation_failed, ...) or None while it runs
    (``end`` None then); ``depth`` and ``link``: a child run's bars sit one level down and
    name that run."""

    name: str
    attempt: int
    direction: str
    start: datetime
    end: datetime | None
    outcome: str | None
    depth: int = 0
    link: str | None = None


@dataclass(frozen=True)
class WaitSpan:
    """A wait at a gate: from entering it until ``end`` (None: still waiting), ended as
    ``outcome`` (``signalled``, ``timed out``, or None)."""

    event: str
    start: datetime
    end: datetime | None
    outcome: str | None
    depth: int = 0


@dataclass(frozen=True)
class Timeline:
    """A run's timeline twice: as text ``entries`` and as ``bars`` and ``waits``."""

    entries: tuple[TimelineEntry, ...]
    bars: tuple[TimelineBar, ...]
    waits: tuple[WaitSpan, ...]


@dataclass(frozen=True)
class HoldView:
    """What a ``held`` run waits on: its step (record name), the error it failed with after
    ``attempts`` attempts, and when its hold timeout unwinds it (None: never)."""

    step: str
    error: str | None
    attempts: int
    unwinds_at: datetime | None


@dataclass(frozen=True)
class RunView:
    """Everything stored about one run, with its child runs nested under their steps.
    ``definition_deployed``: this process has the run's version; ``waiting``: what holds
    the run, in the sentence every view says (``waiting.reason``); ``waiting_for_version``:
    the version a worker without it handed the run's message back for."""

    record: ExecutionRecord
    definition_deployed: bool
    archived_at: datetime | None
    signals: tuple[SignalView, ...]
    steps: tuple[StepView, ...]
    history: tuple[HistoryRow, ...]
    waiting_for_event: str | None
    waiting_for_version: str | None
    waiting: str | None
    graph: tuple[GraphNode, ...]
    timeline: Timeline
    #: Set while the run is ``held``.
    hold: HoldView | None = None
    #: The labels it was started with, by key.
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def saga(self) -> str:
        return self.record.saga_name

    @property
    def state(self) -> str:
        return self.record.state.value

    @property
    def rollback_status(self) -> str | None:
        status = self.record.rollback_status
        return None if status is None else status.value

    @property
    def trace_id(self) -> str | None:
        """The id of the run's OpenTelemetry trace (``celery_saga.tracing``), if traced."""
        return trace_id_of(self.record.trace_context)


@dataclass(frozen=True)
class ListedRun:
    """A run as a list shows it: its record, and the reason column every list prints (why
    it failed or parked, else what it waits for)."""

    record: ExecutionRecord
    reason: str
    waiting_for_event: str | None = None
    waiting_for_version: str | None = None


@dataclass(frozen=True)
class RunList:
    """One page of runs; pass ``next_cursor`` on for the next."""

    items: tuple[ListedRun, ...]
    next_cursor: str | None
