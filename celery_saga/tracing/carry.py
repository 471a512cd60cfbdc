"""The run's trace as a message carries it: the ``trace`` key of the ``celery_saga`` header
(``worker/saga_header.py``) holds the ``traceparent`` stored with the run, so a worker
opens an attempt's span in the run's trace without reading the run (the first delivery of
a step claims it blind: a read there would cost the hot path a statement).

While a message of a run is handled, or a run is started, its trace is ``carried``: every
message the process sends meanwhile carries it on. Those are the run's own messages, or a
sub-saga's and its parent's, whose traces are one (a child's root span is a child span of
its parent's trace)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: The header key of the run's ``traceparent``.
TRACE = "trace"

_carried: ContextVar[str | None] = ContextVar("saga_trace", default=None)


@contextmanager
def carrying(traceparent: str | None) -> Iterator[None]:
    """While the block runs, the carried trace is ``traceparent`` (None: none)."""
    token = _carried.set(traceparent)
    try:
        yield
    finally:
        _carried.reset(token)


def adopt(traceparent: str | None) -> None:
    """In a ``carrying`` block that carries no trace (a message sent by a sweep, or by a
    process without tracing), the run's trace as read with its row, from here on: what the
    handling sends next (a sub-saga's start, the next step's message) stays in the trace."""
    if traceparent is not None and _carried.get() is None:
        _carried.set(traceparent)  # reset with the enclosing block


def carried() -> str | None:
    """The run's trace carried here, if any."""
    return _carried.get()


def carried_by(header: Mapping[str, Any] | None) -> str | None:
    """The trace a message's ``celery_saga`` header carries (None: none)."""
    trace = header.get(TRACE) if header else None
    return trace if isinstance(trace, str) else None


def carry_on(header: dict[str, Any]) -> None:
    """Put the carried trace in ``header`` (a message sent again keeps the one it has)."""
    trace = _carried.get()
    if trace is not None and TRACE not in header:
        header[TRACE] = trace
