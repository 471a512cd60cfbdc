"""Guarantee 22's hand-backs as the broker sees them, on RabbitMQ: a consumer keeps no more
messages it cannot run than twice its prefetch window (the rest of the queue stays with the
other workers), its loop goes on while a copy is on its way back, and the original is
acknowledged only once the broker has confirmed the copy (a refused copy leaves the
original on the queue).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Producer, Queue

from celery_saga import ExecutionState, Saga, SagaEngine
from celery_saga.worker.embedded import embedded_worker
from celery_saga.worker.saga_header import HANDED, HEADER
from tests.conftest import BROKERS, PORTS, _test_database_url, require_services
from tests.deploy_rig import DeployRig
from tests.test_crash_recovery import wait_for

AMQP = BROKERS["postgres-rabbitmq"]


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[DeployRig]:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    rig = DeployRig(AMQP, _test_database_url(), tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def ready_on(rig: DeployRig) -> int:
    """The messages of the rig's queue that no consumer holds (RabbitMQ's own count)."""
    with rig.client.app.connection_for_write() as connection:
        declared = connection.default_channel.queue_declare(rig.queue, passive=True)
    return int(declared.message_count)


def test_an_old_worker_keeps_at_most_twice_its_prefetch_window_of_what_it_cannot_run(
    rabbit: DeployRig,
) -> None:
    """24 runs whose first step is a task the old worker lacks; the worker's window is 2
    (``-c 2``, ``--prefetch-multiplier 1``). It raises its window for the first two it keeps,
    then keeps at most two more in its own slots and fetches nothing else: never more than 4
    unacknowledged, while it goes on handing back what it keeps."""
    runs = [rabbit.clients["2"].start("rollout", {"n": n}).id for n in range(24)]
    rabbit.start_worker("old", "1")
    kept = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        # Unacknowledged = on the broker - ready; on the broker is 24, or 25 while a copy is
        # out and its original not yet acknowledged: so kept <= unacknowledged <= kept + 1.
        kept.append(len(runs) - ready_on(rabbit))
        time.sleep(0.05)
    print(f"kept unacknowledged over 4 s: most {max(kept)}, samples {kept[::10]}")
    assert max(kept) <= 4, f"the old worker kept up to {max(kept)} of the queue's messages"
    assert rabbit.log("old").count("handed back (") >= 8, "it goes on handing back"


#: How long the broker takes to accept a handed-back copy, in the test below.
SLOW_BROKER = 3.0


def _bill(version: str) -> Saga:
    return Saga("bill", version=version).step("charge", lambda: version)


def _rabbit_engine(queue: str, store: str, version: str, exchange: str = "") -> SagaEngine:
    """An engine on RabbitMQ with version ``version`` of ``bill``; its queue is bound to
    ``exchange`` when one is named (else Celery sends through the default exchange)."""
    app = Celery(f"{queue}-{version}", broker=AMQP, set_as_current=False)
    app.conf.update(task_default_queue=queue, worker_hijack_root_logger=False)
    if exchange:
        app.conf.update(
            task_queues=[Queue(queue, Exchange(exchange, "topic"), routing_key=queue)],
            task_default_exchange=exchange,
            task_default_exchange_type="topic",
            task_default_routing_key=queue,
        )
    engine = SagaEngine(app, store_url=store)
    engine.register(_bill(version))
    return engine


def _forget(engines: list[SagaEngine], queue: str) -> None:
    with engines[0].app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)
    for engine in engines:
        engine.db.dispose()


def test_a_copy_the_broker_refuses_leaves_its_original_on_the_queue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The exchange of the queue is deleted while the old worker keeps the message: the
    broker refuses the copy, so the original goes back to the queue, never acknowledged,
    and the run completes once a worker with its version comes."""
    require_services(PORTS["postgres-rabbitmq"])
    queue, store = f"hand-back-refused-{uuid.uuid4().hex[:8]}", f"sqlite:///{tmp_path}/s.sqlite3"
    exchange = f"{queue}-exchange"
    old = _rabbit_engine(queue, store, "1", exchange)
    new = _rabbit_engine(queue, store, "2", exchange)

    def logged(text: str) -> bool:
        return any(text in r.getMessage() for r in caplog.records)

    try:
        with (
            caplog.at_level(logging.WARNING, logger="celery_saga"),
            embedded_worker(old.app, queues=[queue], hostname=f"old-{queue}@localhost"),
        ):
            run = new.start("bill")
            wait_for(lambda: logged("handed back (2)"), timeout=10)  # a pause of 1 s
            with old.app.connection_for_write() as connection:
                connection.default_channel.exchange_delete(exchange)
            time.sleep(2.0)  # the copy of the second hand-back goes out meanwhile
            with old.app.connection_for_write() as connection:
                old.app.amqp.queues[queue](connection.default_channel).declare()
        with embedded_worker(new.app, queues=[queue], hostname=f"new-{queue}@localhost"):
            assert run.wait(timeout=10).state is ExecutionState.COMPLETED
        assert run.get().results == {"charge": "2"}
        assert logged("could not be sent back"), "the broker refused the copy"
    finally:
        _forget([old, new], queue)


def test_the_consumer_answers_while_a_slow_broker_takes_a_copy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy that takes the broker ``SLOW_BROKER`` seconds to accept is sent from a thread
    of its own: the worker answers a ping meanwhile (its consumer's loop never waits)."""
    require_services(PORTS["postgres-rabbitmq"])
    sending = threading.Event()
    publish = Producer.publish

    def slow_publish(self: Producer, body: Any, *args: Any, **kwargs: Any) -> Any:
        if ((kwargs.get("headers") or {}).get(HEADER) or {}).get(HANDED):
            sending.set()
            time.sleep(SLOW_BROKER)
        return publish(self, body, *args, **kwargs)

    monkeypatch.setattr(Producer, "publish", slow_publish)
    queue, store = f"hand-back-slow-{uuid.uuid4().hex[:8]}", f"sqlite:///{tmp_path}/s.sqlite3"
    old, new = _rabbit_engine(queue, store, "1"), _rabbit_engine(queue, store, "2")
    node = f"old-{queue}@localhost"
    try:
        with embedded_worker(old.app, queues=[queue], hostname=node):
            new.start("bill")
            assert sending.wait(10), "the old worker did not hand the message back"
            began = time.monotonic()
            replies = old.app.control.ping(destination=[node], timeout=2.0)
            took = time.monotonic() - began
    finally:
        _forget([old, new], queue)
    print(f"ping answered in {took:.3f} s while a copy took {SLOW_BROKER} s")
    assert replies and took < 1.0, f"the consumer answered after {took:.1f} s: {replies}"
