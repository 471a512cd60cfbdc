"""An in-process worker for scripts, demos and tests: no broker or database server needed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker


@contextmanager
def embedded_worker(
    app: Celery,
    *,
    pool: str = "threads",
    concurrency: int = 4,
    loglevel: str = "WARNING",
    **options: Any,
) -> Iterator[Any]:
    """Run a real Celery worker for ``app`` in a background thread of this process.

    With the ``memory://`` broker this is a complete saga deployment inside one process.
    Set ``broker_transport_options={"polling_interval": 0.01}`` for snappy hand-offs.
    """
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        loglevel=loglevel,
        perform_ping_check=False,
        shutdown_timeout=10,
        hostname=options.pop("hostname", "embedded@localhost"),
        **options,
    ) as worker:
        yield worker
