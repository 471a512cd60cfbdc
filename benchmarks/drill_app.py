"""The worker side of ``incident_drill.py``: a five-step checkout saga whose ``charge``
calls the drill's payment provider over HTTP under the step's idempotency key.

Read from the environment at import (the driver sets it for its workers, its beat and its
CLI): ``DRILL_BROKER``, ``DRILL_STORE``, ``DRILL_QUEUE``, ``DRILL_PROVIDER`` (the
provider's base URL), ``DRILL_POLICY`` (``hold`` or ``unwind``), ``DRILL_RETRY`` and
``DRILL_BACKOFF`` (charge's attempts and their backoff), ``DRILL_LEASE`` and
``DRILL_RECOVER_AFTER`` (seconds).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Mapping

from celery import Celery

from celery_saga import Saga, SagaContext, SagaEngine


def _call(provider: str, kind: str, key: str) -> None:
    """One call to the provider; a refused connection or an error status raises."""
    request = urllib.request.Request(f"{provider}/{kind}/{key}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


def _noop(ctx: SagaContext) -> None:
    return None


def make(env: Mapping[str, str]) -> tuple[Celery, SagaEngine, str]:
    """The app, its engine and the checkout saga's name, as ``env`` configures them."""
    policy = env.get("DRILL_POLICY", "hold")
    provider = env.get("DRILL_PROVIDER", "http://127.0.0.1:1")
    celery = Celery("incident_drill", broker=env.get("DRILL_BROKER", "memory://localhost/"))
    celery.conf.update(
        task_default_queue=env.get("DRILL_QUEUE", "incident_drill"),
        saga_store_url=env.get("DRILL_STORE", "sqlite:///drill.sqlite3"),
        saga_lease_seconds=float(env.get("DRILL_LEASE", "20")),
        # Not much below the defaults: a sweep that republishes runs merely queued behind a
        # backlog longer than this adds to the backlog (see benchmarks/README.md).
        saga_recover_after=float(env.get("DRILL_RECOVER_AFTER", "60")),
        saga_recover_interval=10.0,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    saga_engine = SagaEngine(celery)

    def charge(ctx: SagaContext) -> dict[str, str]:
        _call(provider, "charge", ctx.idempotency_key)
        return {"charged": ctx.idempotency_key}

    def refund(ctx: SagaContext) -> None:
        _call(provider, "refund", ctx.forward_key)

    name = f"drill_checkout_{policy}"
    saga_engine.register(
        Saga(name)
        .step("validate", _noop)
        .step("reserve", _noop, compensate=_noop)
        .step(
            "charge",
            charge,
            compensate=refund,
            retry=int(env.get("DRILL_RETRY", "3")),
            backoff=float(env.get("DRILL_BACKOFF", "0.5")),
            on_failure=policy,
        )
        .step("ship", _noop, compensate=_noop)
        .step("notify", _noop)
    )
    return celery, saga_engine, name


app, engine, SAGA = make(os.environ)
