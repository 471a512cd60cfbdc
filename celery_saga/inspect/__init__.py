"""The read API: runs as typed, frozen values, the same ones ``celery saga show/list/stats``,
the web view and the Django admin render. ``SagaEngine.inspect()`` returns an
``Inspector``; see the API page of the docs for an example."""

from celery_saga.inspect.reads import Inspector
from celery_saga.inspect.values import (
    GraphNode,
    HistoryRow,
    ListedRun,
    MissingChild,
    ReversalView,
    RunList,
    RunView,
    SignalView,
    StepView,
    Timeline,
    TimelineBar,
    TimelineEntry,
    WaitSpan,
    Within,
)
from celery_saga.store.inspection import Filters, Stats
from celery_saga.store.replica import ReplicaLag

__all__ = [
    "Filters",
    "GraphNode",
    "HistoryRow",
    "Inspector",
    "ListedRun",
    "MissingChild",
    "ReplicaLag",
    "ReversalView",
    "RunList",
    "RunView",
    "SignalView",
    "Stats",
    "StepView",
    "Timeline",
    "TimelineBar",
    "TimelineEntry",
    "WaitSpan",
    "Within",
]
