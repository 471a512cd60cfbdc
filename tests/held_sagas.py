"""Sagas of the test app whose steps hold their run on a final failure (issue 42).

``charge`` fails while the switch its input names is on (a provider that is down), and
writes one ``forward`` ledger row per attempt that reached it and one ``effect`` row per
charge that went through (keyed by its idempotency key: the effect a retry must not
repeat).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_saga import Saga, SagaContext


def define(test_app: Any) -> None:
    fwd, rev = test_app.forward, test_app.reverse

    def charge(ctx: SagaContext) -> dict[str, Any]:
        test_app.write(ctx, "forward", f"attempt={ctx.attempt}")
        switch = ctx.input.get("down")
        if switch and test_app.switch_on(switch):
            raise ConnectionError(f"payment provider down (order {ctx.input.get('order')})")
        test_app.write(ctx, "effect", ctx.idempotency_key)
        return {"charged": ctx.input.get("order"), "key": ctx.idempotency_key}

    def charge_hanging(ctx: SagaContext) -> dict[str, Any]:
        """As ``charge``, but each attempt hangs while the switch ``hang`` names is on (a
        provider that stopped answering), its pool process's id in its ledger row."""
        test_app.write(ctx, "forward", f"attempt={ctx.attempt} pid={os.getpid()}")
        ends = time.monotonic() + 60
        while test_app.switch_on(ctx.input["hang"]) and time.monotonic() < ends:
            time.sleep(0.1)
        test_app.write(ctx, "effect", ctx.idempotency_key)
        return {"charged": ctx.input.get("order"), "key": ctx.idempotency_key}

    def receipt_schema(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not isinstance(value.get("charged"), int):
            raise ValueError("field 'charged' must be an integer")
        return value

    quick = {"retry": 2, "backoff": 0.05, "on_failure": "hold"}
    test_app.engine.register(
        Saga("held_order")
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge, compensate=rev, **quick)
        .step("ship", fwd, compensate=rev),
        Saga("held_pivoted")
        .step("reserve", fwd, compensate=rev)
        .pivot()
        .step("charge", charge, compensate=rev, **quick),
        Saga("held_schema")
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge, compensate=rev, output_schema=receipt_schema, **quick),
        Saga("held_briefly", on_failure="hold", hold_timeout=1.5)
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge, compensate=rev, retry=1),
        Saga("held_slow")
        .step("reserve", fwd, compensate=rev)
        .step("slow", fwd, compensate=rev, timeout=1, retry=1, on_failure="hold"),
        Saga("held_hanging")
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge_hanging, compensate=rev, retry=1, on_failure="hold")
        .step("ship", fwd, compensate=rev),
        Saga("held_deadline", on_failure="hold", timeout=3)
        .step("reserve", fwd, compensate=rev)
        .step("charge", charge, compensate=rev, retry=1),
    )
