"""A message a worker cannot run goes back to the broker at the pace its log line says
(guarantee 22): for a task this worker lacks (a step only a newer version has), for a
version of a saga it lacks, or of a run its store does not hold (a worker of another
deployment shares the queue). The run is never failed for it; the message is never dropped,
and keeps its task id, arguments, headers and routing.

In the consumer (``HandBacks.task_handler``), before Celery honours the message's ETA or
hands it to the pool, the saga header alone decides (``decisions/hand_back.py``). The
message is held unacknowledged for this hand-back's step of the backoff (the prefetch window
grows by one meanwhile, as for a Celery ETA task), then sent again with the header's
``handed`` count raised, and acknowledged: a worker that can run it runs it as soon as it
takes it. A worker that stops or loses its connection meanwhile gives it back to
the broker unacknowledged, which offers it again at once. One WARNING line per hand-back; the
run is marked as waiting for its version once per message, from a thread of its own (the
consumer never waits for the store). When a worker that can run a held message starts
(``arrivals``), the message goes back at once and its backoff stays short for a while.

Where only the store can tell (a message naming no version, a run of another store), a pool
process hands the message back instead (``hand_back_pool``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_saga.decisions.hand_back import (
    Arrival,
    HandBackReason,
    Wanted,
    can_take,
    hand_back_reason,
    hold_seconds,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.store.identity import shown_store, store_identity
from celery_saga.worker.hand_back_notes import HandBackNotes, Handed, log_hand_back
from celery_saga.worker.hand_back_pool import Mark, Marks
from celery_saga.worker.saga_header import ABSENT, HANDED, HEADER, MARKED, STORE, version_of

if TYPE_CHECKING:
    from celery_saga.worker.engine import SagaEngine

logger = logging.getLogger("celery_saga")

#: The message properties a hand-back sends again as they came (the rest is the broker's).
_PROPERTIES = ("correlation_id", "reply_to", "priority", "delivery_mode")
#: How long after a worker that can take a message arrived its hand-backs stay short.
ARRIVAL_SECONDS = 60.0


@dataclass(eq=False)
class _Held:
    """A message held by a consumer, what it needs, and how it will be sent back."""

    consumer: Any
    message: Any
    wanted: Wanted
    header: dict[str, Any]
    mark: Mark | None
    entry: Any = field(default=None)


class HandBacks:
    """This process's hand-backs, for the engine ``engine``: see the module's docstring."""

    def __init__(self, engine: SagaEngine) -> None:
        self.engine = engine
        self.store = store_identity(engine.db.url)
        self.shown_store = shown_store(engine.db.url)
        self.notes = HandBackNotes()
        self._marks = Marks(engine)
        self._lock = threading.Lock()
        self._held: weakref.WeakKeyDictionary[Any, set[_Held]] = weakref.WeakKeyDictionary()
        self._arrived: dict[str, tuple[Arrival, float]] = {}  # worker -> (it, until when)

    def task_handler(self, consumer: Any, received: Any) -> Any:
        """Wrap ``received``, the handler Celery's consumer calls for each task message."""

        def on_task_received(message: Any) -> Any:
            try:
                reason = self.reason(consumer, message)
            except Exception:  # a header we cannot read: Celery's own handling follows
                logger.exception("could not tell whether a saga message can run here")
                reason = None
            if reason is None:
                return received(message)
            self.hold(consumer, message, reason)
            return None

        return on_task_received

    def reason(self, consumer: Any, message: Any) -> HandBackReason | None:
        """Why this worker hands ``message`` back, from its headers alone; None: it runs."""
        headers = getattr(message, "headers", None)
        if not isinstance(headers, dict):
            return None  # protocol 1: Celery decides
        header = headers.get(HEADER)
        if not isinstance(header, dict) or "id" not in header:
            return None  # not a saga message
        saga, version = header.get("saga"), version_of(header)
        known = None
        if isinstance(saga, str) and version is not None:
            known = self.engine.catalog(saga, version) is not None
        return hand_back_reason(
            task_known=headers.get("task") in consumer.strategies,
            version_known=known,
            absent_here=self.store in (header.get(ABSENT) or ()),
        )

    def hold(self, consumer: Any, message: Any, reason: HandBackReason) -> None:
        """Keep ``message`` for its step of the backoff, then send it back (``_release``)."""
        header = dict(message.headers[HEADER])
        times = int(header.get(HANDED) or 0)
        wanted = _wanted(message.headers.get("task"), header)
        arrived, draw = self._taker_arrived(wanted), get_clock().random()
        wait = hold_seconds(times, taker_arrived=arrived, draw=draw)
        handed = Handed.of(header, wanted.task, reason, times + 1, wait, message.delivery_info)
        log_hand_back(handed, self.shown_store)
        self.notes.add(handed)
        first = reason is not HandBackReason.RUN_NOT_IN_STORE and not header.get(MARKED)
        mark = self._marks.submit(handed) if first else None
        held = _Held(consumer, message, wanted, {**header, HANDED: times + 1}, mark)
        consumer.qos.increment_eventually()
        with self._lock:
            self._held.setdefault(consumer, set()).add(held)
        held.entry = consumer.timer.call_after(wait, self._release, (held,), priority=6)

    def _release(self, held: _Held) -> None:
        with self._lock:
            mine = self._held.get(held.consumer, set())
            if held not in mine:
                return  # released already (a worker arrived), or let go
            mine.discard(held)
        if held.mark is not None and held.mark.wrote:
            held.header[MARKED] = True
        consumer, message = held.consumer, held.message
        errors = getattr(consumer, "connection_errors", ())
        try:
            republish(self.engine, message, held.header)
        except Exception as error:
            logger.warning(
                "execution %s: its message could not be sent back (%r); the broker offers "
                "it again as it came",
                held.header.get("id"),
                error,
            )
            message.reject_log_error(logger, errors, requeue=True)
        else:
            message.ack_log_error(logger, errors)
        finally:
            consumer.qos.decrement_eventually()

    def let_go(self, consumer: Any) -> None:
        """``consumer`` stops or lost its connection: its held messages go back to the
        broker as they came (a broker that lost the connection has them back already; the
        in-process ``memory://`` one would keep them unacknowledged for good)."""
        with self._lock:
            held = self._held.pop(consumer, set())
        for one in held:
            try:
                consumer.timer.cancel(one.entry)
                one.message.reject(requeue=True)
            except Exception:  # the channel is gone with the connection: so is the message
                logger.debug("could not give a held message back", exc_info=True)
        if held:
            logger.info("%d held message(s) go back to the broker as they came", len(held))

    def arrived(self, node: str, arrival: Arrival) -> int:
        """A worker that can take some held messages started: they go back now, and the
        next hand-backs of what it can take stay short for ``ARRIVAL_SECONDS``."""
        with self._lock:
            self._arrived[node] = (arrival, time.monotonic() + ARRIVAL_SECONDS)
            due = [h for held in self._held.values() for h in held if can_take(arrival, h.wanted)]
        for held in due:
            self._release(held)
        return len(due)

    def _taker_arrived(self, wanted: Wanted) -> bool:
        now = time.monotonic()
        with self._lock:
            for node, (arrival, until) in list(self._arrived.items()):
                if until < now:
                    del self._arrived[node]
                elif can_take(arrival, wanted):
                    return True
        return False


def _wanted(task: Any, header: dict[str, Any]) -> Wanted:
    saga, store = header.get("saga"), header.get(STORE)
    return Wanted(
        str(task),
        str(saga) if saga is not None else None,
        version_of(header),
        str(store) if store is not None else None,
    )


def republish(engine: SagaEngine, message: Any, header: dict[str, Any]) -> None:
    """Send ``message`` again as it came (body, headers, properties, exchange and routing
    key), with the saga header ``header``. A message's own ETA (a retry's countdown) stays:
    a worker that can run it holds it until then, as Celery does."""
    info = message.delivery_info or {}
    properties = message.properties or {}
    kept = {key: properties[key] for key in _PROPERTIES if properties.get(key) is not None}
    app = engine.app
    with app.producer_or_acquire() as producer:
        producer.publish(
            message.body,
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key"),
            headers={**message.headers, HEADER: header},
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            retry=True,
            retry_policy=app.conf.task_publish_retry_policy,
            **kept,
        )
