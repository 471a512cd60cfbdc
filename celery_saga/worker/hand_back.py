"""A message a worker cannot run goes back to the broker at the pace its log line says
(guarantee 22): for a task this worker lacks (a step only a newer version has), for a
version of a saga it lacks, or of a run its store does not hold (a worker of another
deployment shares the queue). The run is never failed for it; the message is never dropped,
and keeps its task id, arguments, headers and routing.

In the consumer (``HandBacks.task_handler``), before Celery honours the message's ETA or
hands it to the pool, the saga header alone decides (``decisions/hand_back.py``). The
message is kept unacknowledged for this hand-back's step of the backoff (the first ones
raise the prefetch window by one meanwhile, as for a Celery ETA task; a consumer keeps at
most twice its window, ``raises_window``), then sent again with the header's ``handed``
count raised, from a thread of its own (``hand_back_sender``: the consumer's loop never
waits for the broker), and acknowledged from the consumer's timer once the broker has the
copy: a worker that can run it runs it as soon as it takes it. A worker that stops or loses
its connection meanwhile gives it back to the broker unacknowledged, which offers it again
at once. One WARNING line per hand-back; the run is marked as waiting for its version once
per message, from a thread of its own (the consumer never waits for the store). When a
worker that can run a kept message starts (``arrivals``), the message goes back at once and
its backoff stays short for a while.

Where only the store can tell (a message naming no version, a run of another store), a pool
process hands the message back instead (``hand_back_pool``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from celery_saga.decisions.hand_back import (
    Arrival,
    HandBackReason,
    Wanted,
    can_take,
    hand_back_reason,
    hold_seconds,
    raises_window,
)
from celery_saga.runtime.clock import get_clock
from celery_saga.worker.hand_back_notes import Handed, log_hand_back
from celery_saga.worker.hand_back_pool import Mark, Marks
from celery_saga.worker.hand_back_sender import Sender
from celery_saga.worker.parts import WorkerParts
from celery_saga.worker.saga_header import ABSENT, HANDED, HEADER, MARKED, STORE, version_of

logger = logging.getLogger("celery_saga")

#: How long after a worker that can take a message arrived its hand-backs stay short.
ARRIVAL_SECONDS = 60.0
#: While copies are on their way, how often the consumer's timer looks for those sent, to
#: settle their originals in the consumer's loop (where their channel may be used).
SETTLE_EVERY = 0.05


@dataclass(eq=False)
class _Held:
    """A message kept by a consumer, what it needs, and how it will be sent back:
    ``raised`` when keeping it raised the prefetch window of ``qos`` (the consumer's window
    of the connection it came on), ``sending`` once its copy is on its way, ``sent`` once
    the sender knows whether the copy went out."""

    consumer: Any
    message: Any
    wanted: Wanted
    header: dict[str, Any]
    mark: Mark | None
    raised: bool
    qos: Any
    entry: Any = field(default=None)
    sending: bool = False
    sent: bool | None = None


class HandBacks:
    """This process's hand-backs, for one engine's ``parts``: see the module's docstring."""

    def __init__(self, parts: WorkerParts) -> None:
        self.catalog = parts.catalog
        self.store = parts.store_id
        self.shown_store = parts.shown_store
        self.notes = parts.notes
        self._marks = Marks(parts.db)
        self._sender = Sender(parts.app)
        self._lock = threading.Lock()
        #: Each consumer's kept messages not yet settled (acknowledged or given back).
        self._held: weakref.WeakKeyDictionary[Any, set[_Held]] = weakref.WeakKeyDictionary()
        self._settling: weakref.WeakSet[Any] = weakref.WeakSet()  # consumers timed to settle
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
        """Why this worker hands ``message`` back, from its headers alone; None: it runs.
        Only the registered versions are looked at: discovery (module imports) on a miss
        would stall the consumer's loop."""
        headers = getattr(message, "headers", None)
        if not isinstance(headers, dict):
            return None  # protocol 1: Celery decides
        header = headers.get(HEADER)
        if not isinstance(header, dict) or "id" not in header:
            return None  # not a saga message
        saga, version = header.get("saga"), version_of(header)
        known = None
        if isinstance(saga, str) and version is not None:
            known = self.catalog.known(saga, version) is not None
        return hand_back_reason(
            task_known=headers.get("task") in consumer.strategies,
            version_known=known,
            absent_here=self.store in (header.get(ABSENT) or ()),
            times_handed_back=int(header.get(HANDED) or 0),
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
        qos = consumer.qos
        with self._lock:
            held = self._held.setdefault(consumer, set())
            raised = raises_window(
                sum(1 for h in held if h.raised and h.qos is qos),
                int(getattr(consumer, "initial_prefetch_count", 0) or 0),
            )
            one = _Held(consumer, message, wanted, {**header, HANDED: times + 1}, mark, raised, qos)
            held.add(one)
        if raised:
            qos.increment_eventually()
        one.entry = consumer.timer.call_after(wait, self._release, (one,), priority=6)

    def _release(self, held: _Held) -> None:
        """The pause is over (or a worker that can run it arrived): the copy goes out from
        the sender's thread; the consumer's timer settles the original once it is sent."""
        consumer = held.consumer
        with self._lock:
            if held.sending or held not in self._held.get(consumer, ()):
                return  # on its way already, or let go with its consumer
            held.sending = True
            time_it = consumer not in self._settling
            self._settling.add(consumer)
        if held.mark is not None and held.mark.wrote:
            held.header[MARKED] = True
        self._sender.send(held.message, held.header, functools.partial(self._sent, held))
        if time_it:
            consumer.timer.call_after(SETTLE_EVERY, self._settle_sent, (consumer,), priority=6)

    def _sent(self, held: _Held, sent: bool) -> None:
        with self._lock:
            held.sent = sent

    def _settle_sent(self, consumer: Any) -> None:
        """In the consumer's loop (its timer): settle the originals whose copies the sender
        is done with, and look again soon while others are on their way."""
        with self._lock:
            held = self._held.get(consumer, set())
            done = [h for h in held if h.sent is not None]
            held.difference_update(done)
            again = any(h.sending for h in held)
            if not again:
                self._settling.discard(consumer)
        for one in done:
            _settle(one)
        if again:
            consumer.timer.call_after(SETTLE_EVERY, self._settle_sent, (consumer,), priority=6)

    def let_go(self, consumer: Any) -> None:
        """``consumer`` stops or lost its connection: its kept messages go back to the
        broker as they came (a broker that lost the connection has them back already; the
        in-process ``memory://`` one would keep them unacknowledged for good). One whose
        copy is on its way stays unacknowledged: the broker offers it again once the
        connection is gone, and its step still runs once (the run's admission)."""
        with self._lock:
            held = [h for h in self._held.pop(consumer, set()) if not h.sending]
            self._settling.discard(consumer)
        for one in held:
            try:
                consumer.timer.cancel(one.entry)
                one.message.reject(requeue=True)
            except Exception:  # the channel is gone with the connection: so is the message
                logger.debug("could not give a held message back", exc_info=True)
        if held:
            logger.info("%d held message(s) go back to the broker as they came", len(held))

    def arrived(self, node: str, arrival: Arrival) -> int:
        """A worker that can take some kept messages started: they go back now, and the
        next hand-backs of what it can take stay short for ``ARRIVAL_SECONDS``."""
        with self._lock:
            self._arrived[node] = (arrival, time.monotonic() + ARRIVAL_SECONDS)
            due = [
                h
                for held in self._held.values()
                for h in held
                if not h.sending and can_take(arrival, h.wanted)
            ]
        for held in due:
            if held.entry is not None:
                held.consumer.timer.cancel(held.entry)
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


def _settle(held: _Held) -> None:
    """Acknowledge the original of a copy sent; give back, as it came, one whose copy was
    not sent (never acknowledged without its copy)."""
    errors = getattr(held.consumer, "connection_errors", ())
    try:
        if held.sent:
            held.message.ack_log_error(logger, errors)
        else:
            held.message.reject_log_error(logger, errors, requeue=True)
    except Exception:  # its channel went with its connection: so did the original
        logger.debug("could not settle a handed-back message", exc_info=True)
    finally:
        if held.raised:
            held.qos.decrement_eventually()


def _wanted(task: Any, header: dict[str, Any]) -> Wanted:
    saga, store = header.get("saga"), header.get(STORE)
    return Wanted(
        str(task),
        str(saga) if saga is not None else None,
        version_of(header),
        str(store) if store is not None else None,
    )
