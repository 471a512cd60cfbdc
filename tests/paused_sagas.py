"""Sagas of the test app for pausing a step (issue 42).

``charge`` writes one ``forward`` ledger row per body started, with the wall-clock time
it started at (``at=<epoch seconds>``): a test compares them with the stored pause.
"""

from __future__ import annotations

import time
from typing import Any

from celery_saga import Saga, SagaContext, step


def started_at(detail: str) -> float:
    """The start time a ``charge`` ledger row records."""
    return float(detail.split("at=", 1)[1])


def define(test_app: Any) -> None:
    fwd, rev = test_app.forward, test_app.reverse

    def charge(ctx: SagaContext) -> dict[str, Any]:
        test_app.write(ctx, "forward", f"at={time.time():.6f}")
        time.sleep(ctx.input.get("charge_sleep", 0))
        return {"charged": ctx.input.get("order")}

    test_app.engine.register(
        Saga("paused_order")
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge, compensate=rev)
        .step("ship", fwd, compensate=rev),
        Saga("paused_group")
        .step("reserve", fwd, compensate=rev)
        .parallel("notify", step("email", fwd), step("sms", fwd))
        .step("charge", charge, compensate=rev),
    )
