"""A worker that imports a step's task but not the saga it is a step of (a partial deploy).

The task has a default for its argument, so a step message run without admission would
succeed: the test checks it is refused instead. The body appends to ``PARTIAL_LEDGER``.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

from celery_saga import SagaEngine

app = Celery("partial", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("SAGA_TEST_BROKER", "memory://"),
    task_default_queue=os.environ.get("SAGA_TEST_QUEUE", "partial"),
    saga_store_url=os.environ.get("SAGA_TEST_STORE", "sqlite://"),
    worker_hijack_root_logger=False,
)
engine = SagaEngine(app)


@app.task(name="partial.charge", shared=False)
def charge(order: int = 0) -> None:
    with Path(os.environ["PARTIAL_LEDGER"]).open("a") as ledger:
        ledger.write(f"charged {order}\n")
