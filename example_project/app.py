"""The Celery app of the example. Broker and store come from the environment.

``CELERY_BROKER_URL`` (default ``memory://localhost/``, in-process) and ``SAGA_STORE_URL``
(default a SQLite file in the working directory). Point them at RabbitMQ and PostgreSQL and
the same example runs on real infrastructure::

    CELERY_BROKER_URL=amqp://guest:guest@localhost:5672// \\
    SAGA_STORE_URL=postgresql+psycopg://postgres@localhost/test python -m example_project

(with ``--no-worker``, run ``celery -A example_project.app worker`` and
``celery -A example_project.app beat`` yourself, from the same directory: the demo's
warehouse outage is a file there). With your own workers the timelines lack the gate and
retry lines, which the demo collects in its own process.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_saga import SagaEngine

app = Celery("example_project", include=["example_project.tasks"])
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "memory://localhost/"),
    broker_transport_options={"polling_interval": 0.01},
    saga_store_url=os.environ.get("SAGA_STORE_URL", "sqlite:///example_saga.sqlite3"),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,  # Celery 5.3 warns when this is left unset
    saga_timer_interval=1,  # the embedded beat fires wait deadlines within a second
)
engine = SagaEngine(app)

# Definitions are imported by every worker, exactly like tasks.
from example_project import sagas  # noqa: E402,F401
