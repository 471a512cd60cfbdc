"""An in-process worker for scripts, demos and tests: no broker or database server needed."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import celery
from celery import Celery
from celery.beat import EmbeddedService
from celery.contrib.testing.worker import start_worker
from celery.worker import state

logger = logging.getLogger("celery_saga")

#: Seconds between two polls of the ``memory://`` broker when the app sets none.
MEMORY_POLLING_INTERVAL = 0.01


@contextmanager
def embedded_worker(
    app: Celery,
    *,
    pool: str = "threads",
    concurrency: int = 4,
    loglevel: str = "WARNING",
    beat: bool = False,
    **options: Any,
) -> Iterator[Any]:
    """Run a real Celery worker for ``app`` in a background thread of this process.

    With the ``memory://`` broker this is a complete saga deployment inside one process.
    On that broker the worker polls its queues every ``MEMORY_POLLING_INTERVAL`` (10 ms)
    unless ``broker_transport_options`` sets a ``polling_interval`` of its own (kombu's
    default, 1 s, made each hand-off wait up to a second). With ``beat=True`` a
    ``celery beat`` runs in another thread too, sending the extension's sweeps (wait
    deadlines, recovery) on their schedule.
    """
    _poll_memory_broker(app)
    with tempfile.TemporaryDirectory(prefix="celery-saga-beat-") as folder:
        scheduler = None
        if beat:
            schedule = str(Path(folder) / "schedule")
            scheduler = EmbeddedService(app, thread=True, schedule_filename=schedule)
        with start_worker(
            app,
            pool=pool,
            concurrency=concurrency,
            loglevel=loglevel,
            perform_ping_check=False,
            shutdown_timeout=10,
            **_worker_options(options),
        ) as worker:
            if scheduler is not None:
                scheduler.start()
            try:
                yield worker
            finally:
                if scheduler is not None:
                    scheduler.stop()
                _wake_to_stop(app, worker)


def _poll_memory_broker(app: Celery) -> None:
    """The in-process broker has no way to wake its consumer: the worker polls it, and
    sleeps a polling interval whenever no message may be taken (none queued, or its
    prefetch window full). kombu's 1 s made a run of five steps take seconds and 500 runs
    in flight reach 3 workflows/s (benchmarks/embedded.py); 10 ms costs about 100 idle
    wake-ups a second."""
    url = str(app.conf.broker_read_url or app.conf.broker_url or "")
    options = dict(app.conf.broker_transport_options or {})
    if url.startswith("memory://") and "polling_interval" not in options:
        options["polling_interval"] = MEMORY_POLLING_INTERVAL
        app.conf.broker_transport_options = options


def _wake_to_stop(app: Celery, worker: Any) -> None:
    """Ask the worker to stop as ``start_worker`` will, and wake it now: a worker on a
    transport without an event loop (``memory://``, ``filesystem://``) notices the request
    between polls of the broker, each up to 2 s, and polls once more after noticing it, so
    its teardown took 2 to 4 s (tests/test_testing_plugin_speed.py). A control message to
    this worker alone ends a poll at once: one for each."""
    state.should_terminate = 0
    try:
        for _ in range(2):
            app.control.broadcast("ping", destination=[worker.hostname], reply=False)
    except Exception:  # no broadcast on this transport: the worker stops at its next poll
        logger.debug("could not wake the embedded worker to stop it", exc_info=True)


def _worker_options(options: dict[str, Any]) -> dict[str, Any]:
    """Celery before 5.5 names the test worker itself and refuses a ``hostname``."""
    hostname = options.pop("hostname", "embedded@localhost")
    if tuple(celery.VERSION[:2]) >= (5, 5):
        options["hostname"] = hostname
    return options
