"""``Tracer``: every span the package opens, in one place.

The trace of a run (``docs/tracing.md``): its root span ``saga <name>`` is opened around
the run's start, in the caller's process, as a child of the caller's current span; its
W3C ``traceparent`` is written with the run's INSERT (``saga_executions.trace_context``).
An OpenTelemetry span cannot be ended by another process than the one that opened it, so
the root covers the start, and every later span of the run (each attempt, reversal, wait
and operator move, in whatever process and after whatever delay) is opened as a child of
that stored context: one trace per run, whatever the hops.

Where a span's parent comes from: the current span when it is in the run's trace (the
Celery instrumentation's task span of a message the run's own spans sent: ours nest under
it), else the stored root, linked to the current span of another trace (a message the
recovery sweep or the beat re-sent).

Off (``saga_tracing = False``, the API missing, or no tracer provider set while the
setting is left unset), every method does nothing but that test: no statement, no span.
Nothing here reads a payload: span attributes are names, ids, numbers and outcomes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from celery_saga.records import Direction
from celery_saga.runtime.clock import get_clock
from celery_saga.tracing import api
from celery_saga.tracing.api import otel_trace
from celery_saga.tracing.carry import carrying


class AttemptSpan:
    """One attempt's span, begun before its claim (so the claim stores its traceparent)
    and current while the attempt runs; never ended, it is never exported (a refused
    claim). Nothing at all when tracing is off (``OFF``)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span
        self.traceparent = None if span is None else api.carrier_of(span.get_span_context())

    @contextmanager
    def running(self, attempt: int) -> Iterator[AttemptSpan]:
        """Current while the claimed attempt number ``attempt`` runs; ended after."""
        if self._span is None:
            yield self
            return
        self._span.set_attribute("saga.attempt", attempt)
        with otel_trace.use_span(
            self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            try:
                yield self
            except BaseException as error:
                self._span.set_status(_error_status(error))
                raise
            finally:
                self._span.end(end_time=_now())

    def after_lost(self, attempt: int) -> None:
        """This attempt takes over from ``attempt``, whose claim was never settled (its
        process died: its span was never exported): ``saga.lost_attempt``."""
        if self._span is not None:
            self._span.set_attribute("saga.lost_attempt", attempt)

    def failed(self, error: BaseException) -> None:
        """The body raised ``error`` (already scrubbed of the run's secrets): an
        ``exception`` event, and the span's status."""
        if self._span is None:
            return
        self._span.record_exception(error, escaped=False)
        self._span.set_status(_error_status(error))

    def ended(self, outcome: object) -> None:
        """How the attempt ended: ``ran``, ``retrying``, ``failed``, ``stopped``,
        ``takenover``, ``interrupted`` (the worker's shutdown gave it up), ``nobody``."""
        if self._span is not None:
            self._span.set_attribute("saga.outcome", type(outcome).__name__.lower())


OFF = AttemptSpan()


class Tracer:
    """The spans of runs. ``setting``: ``saga_tracing`` (None: on when the API is installed
    and a tracer provider other than the no-op one is set, decided at each span)."""

    def __init__(self, setting: bool | None = None) -> None:
        self.setting = setting

    @property
    def on(self) -> bool:
        if self.setting is False or not api.installed():
            return False
        return self.setting is True or api.provider_set()

    @contextmanager
    def run(
        self,
        saga: str,
        version: str,
        execution_id: str,
        parent_trace: str | None = None,
    ) -> Iterator[str | None]:
        """The root span ``saga <saga>`` around a run's start, current while it lasts;
        yields the ``traceparent`` to store with the run (None when off). ``parent_trace``:
        a sub-saga's parent run's stored trace, so the child's run is a child span in it."""
        if not self.on:
            yield None
            return
        attributes = _run_attributes(saga, version, execution_id)
        parent, links = _parent(parent_trace)
        with self._span(f"saga {saga}", parent, links, attributes) as span:
            traceparent = api.carrier_of(span.get_span_context())
            with carrying(traceparent):
                yield traceparent

    def attempt(
        self,
        direction: Direction,
        run: tuple[str, str, str],
        step: str,
        key: str,
        traces: tuple[str | None, str | None] = (None, None),
    ) -> AttemptSpan:
        """Begin the span of an attempt of ``step`` in ``direction`` (``step <name>`` or
        ``reversal <name>``) of ``run`` (saga, version, execution id), with its idempotency
        ``key``; ``traces``: the run's stored trace, and a reversal's forward attempt's (a
        link to it). ``OFF`` when tracing is off."""
        if not self.on:
            return OFF
        stored, forward = traces
        attributes = {
            **_run_attributes(*run),
            "saga.step": step,
            "saga.direction": direction.value,
            "saga.idempotency_key": key,
        }
        parent, links = _parent(stored)
        undone = api.context_of(forward)
        if undone is not None:
            links.append(otel_trace.Link(undone, {"saga.link": "reverses"}))
        tracer = otel_trace.get_tracer(api.SCOPE)
        name = f"{direction.value} {step}"
        begun = tracer.start_span(
            name, parent, links=links, attributes=attributes, start_time=_now()
        )
        return AttemptSpan(begun)

    def waited(
        self,
        saga: str,
        version: str,
        execution_id: str,
        event: str,
        since: datetime | None,
        stored: str | None,
        ending: str,
    ) -> None:
        """The span ``wait <event>`` of a wait that just ended (``ending``: ``signal`` or
        ``timeout``), from when it was entered (``since``) to now, in the run's trace."""
        if not self.on:
            return
        attributes = {
            **_run_attributes(saga, version, execution_id),
            "saga.event": event,
            "saga.wait_ending": ending,
        }
        parent, links = _parent(stored)
        now = _now()
        start = now if since is None else min(now, _nanoseconds(since))
        tracer = otel_trace.get_tracer(api.SCOPE)
        span = tracer.start_span(
            f"wait {event}", parent, links=links, attributes=attributes, start_time=start
        )
        span.end(end_time=now)

    @contextmanager
    def action(
        self, action: str, execution_id: str, actor: str | None, stored: str | None
    ) -> Iterator[None]:
        """The span ``operator <action>`` (cancel, resume_compensation, ...) of a move
        ``actor`` made on a run, in the run's trace (``stored``), current while it is
        carried out; the messages it sends carry the run's trace (even with tracing off
        here, for the processes that trace)."""
        with carrying(stored):
            if not self.on:
                yield
                return
            attributes = {"saga.execution_id": execution_id, "saga.action": action}
            if actor is not None:
                attributes["saga.actor"] = actor
            parent, links = _parent(stored)
            with self._span(f"operator {action}", parent, links, attributes):
                yield

    @contextmanager
    def operation(
        self, action: str, actor: str | None, attributes: Mapping[str, Any]
    ) -> Iterator[Any]:
        """The span ``operator <action>`` of a move on many runs or none (a pause, an
        unpause, a bulk operation), in the caller's trace; current while it is carried
        out, so the span of each run it moves (``action``) links to it. Yields the span
        (None when off) for ``noted``."""
        if not self.on:
            yield None
            return
        named = {"saga.action": action, **attributes}
        if actor is not None:
            named["saga.actor"] = actor
        with self._span(f"operator {action}", None, [], named) as span:
            yield span

    def queued(self) -> None:
        """The run whose root span is current was stored ``queued`` by its flow-control
        limit: its root span says so (``saga.queued``); its start is a span of its own."""
        if self.on:
            otel_trace.get_current_span().set_attribute("saga.queued", True)

    def noted(self, span: Any, name: str, value: Any) -> None:
        """Set attribute ``name`` on ``span`` (one ``operation`` yielded; None: off)."""
        if span is not None:
            span.set_attribute(name, value)

    @contextmanager
    def admission(
        self, saga: tuple[str, str, str], freed_by: str, stored: str | None
    ) -> Iterator[None]:
        """The span ``start <saga>`` of a queued run (``saga``: name, version, execution
        id) that the run ``freed_by`` started as it gave its flow-control slot back: in the
        queued run's trace (``stored``), linked to the current span of the run that freed
        it; what is sent meanwhile carries the queued run's trace."""
        with carrying(stored):
            if not self.on:
                yield
                return
            attributes = {**_run_attributes(*saga), "saga.admitted_by": freed_by}
            parent, links = _parent(stored)
            with self._span(f"start {saga[0]}", parent, links, attributes):
                yield

    @contextmanager
    def _span(
        self, name: str, parent: Any, links: list[Any], attributes: Mapping[str, Any]
    ) -> Iterator[Any]:
        # An error passing through (the store's, carrying its statement's parameters) is
        # not recorded: only its type, as the status.
        tracer = otel_trace.get_tracer(api.SCOPE)
        with tracer.start_as_current_span(
            name,
            context=parent,
            links=links,
            attributes=attributes,
            start_time=_now(),
            end_on_exit=False,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as error:
                span.set_status(_error_status(error))
                raise
            finally:
                span.end(end_time=_now())


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _nanoseconds(moment: datetime) -> int:
    since = moment - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000_000 + since.microseconds * 1_000


def _now() -> int:
    """Now, from the package's clock (``runtime/clock.py``: every time the library reads,
    a span's start and end too), as OpenTelemetry's nanoseconds since the epoch."""
    return _nanoseconds(get_clock().now())


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a stored ``traceparent``, without the API."""
    if not traceparent:
        return None
    fields = traceparent.split("-")
    return fields[1] if len(fields) == 4 and len(fields[1]) == 32 else None


def _error_status(error: BaseException) -> Any:
    # Its type only: an error's text may carry what a payload held (the store's errors
    # name their statement's parameters); the body's own is recorded as its event.
    return otel_trace.Status(otel_trace.StatusCode.ERROR, type(error).__name__)


def _run_attributes(saga: str, version: str, execution_id: str) -> dict[str, Any]:
    return {"saga.name": saga, "saga.version": version, "saga.execution_id": execution_id}


def _parent(stored: str | None) -> tuple[Any, list[Any]]:
    """The context to open a run's span in, and its links (see the module's docstring)."""
    root = api.context_of(stored)
    current = otel_trace.get_current_span().get_span_context()
    if root is None or (current.is_valid and current.trace_id == root.trace_id):
        return None, []
    links = [otel_trace.Link(current)] if current.is_valid else []
    return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(root)), links
