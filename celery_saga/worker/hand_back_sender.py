"""Sends the messages a consumer kept back to the broker, from a thread of its own, and
says whether each copy went out (guarantee 22).

The consumer's loop never waits for the broker: at the end of a kept message's pause,
``HandBacks`` gives it to this thread, which publishes the copy on a connection of its own
and reports; the consumer's timer then settles the original in the consumer's loop:
acknowledged when the copy was sent, rejected back to the queue as it came when it was not
(never acknowledged without its copy, so never lost). On RabbitMQ that connection uses
publisher confirms: a copy counts as sent only once the broker confirmed it, and one the
broker refuses (its exchange gone, its queue full) raises instead of vanishing after the
original was acknowledged (tests/test_hand_back_broker.py). A copy already sent whose
original the consumer could not acknowledge (its connection was lost meanwhile) comes back
once more, as the original: the run's admission refuses the second, as for any duplicate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from celery import Celery

from celery_saga.worker.saga_header import HEADER

logger = logging.getLogger("celery_saga")

#: The message properties a copy carries as the original came (the rest is the broker's).
_PROPERTIES = ("correlation_id", "reply_to", "priority", "delivery_mode")
#: How long a copy waits for the broker's confirm before it counts as not sent (the
#: original then goes back to the queue: at worst the message is there twice, never lost).
CONFIRM_TIMEOUT = 10.0

#: Told whether the copy was sent, in the sender's thread.
Report = Callable[[bool], None]


@dataclass(frozen=True)
class _Copy:
    message: Any
    header: dict[str, Any]
    report: Report


class Sender:
    """Publishes copies of kept messages from one thread, started on first use (in a
    worker's main process, after its pool has forked), on one connection made on first
    use and made again after it failed."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._queue: SimpleQueue[_Copy] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connection: Any = None  # kombu's, made on first use
        self._producer: Any = None

    def send(self, message: Any, header: dict[str, Any], report: Report) -> None:
        """Send ``message`` again with the saga header ``header``, then ``report(sent)``."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="saga-hand-back-sender", daemon=True
                )
                self._thread.start()
        self._queue.put(_Copy(message, header, report))

    def _run(self) -> None:
        while True:
            copy = self._queue.get()
            copy.report(self._publish(copy))

    def _publish(self, copy: _Copy) -> bool:
        try:
            republish(self._ready(), copy.message, copy.header, self.app)
        except Exception as error:
            logger.warning(
                "execution %s: its message could not be sent back (%r); it goes back to the "
                "broker as it came",
                copy.header.get("id"),
                error,
            )
            self._drop()
            return False
        return True

    def _ready(self) -> Any:
        if self._producer is None:
            connection = self.app.connection_for_write()
            if connection.transport.driver_type == "amqp":
                connection.transport_options["confirm_publish"] = True
            self._connection, self._producer = connection, connection.Producer()
        return self._producer

    def _drop(self) -> None:
        """Forget a connection that failed (a channel the broker closed stays closed)."""
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            try:
                connection.close()
            except Exception:  # it failed already: nothing more to give back
                logger.debug("could not close the hand-back connection", exc_info=True)


def republish(producer: Any, message: Any, header: dict[str, Any], app: Celery) -> None:
    """Send ``message`` again as it came (body, headers, properties, exchange and routing
    key), with the saga header ``header``. A message's own ETA (a retry's countdown) stays:
    a worker that can run it holds it until then, as Celery does."""
    info = message.delivery_info or {}
    properties = message.properties or {}
    kept = {key: properties[key] for key in _PROPERTIES if properties.get(key) is not None}
    producer.publish(
        message.body,
        exchange=info.get("exchange") or "",
        routing_key=info.get("routing_key"),
        headers={**message.headers, HEADER: header},
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        retry=True,
        retry_policy=app.conf.task_publish_retry_policy,
        confirm_timeout=CONFIRM_TIMEOUT,
        **kept,
    )
