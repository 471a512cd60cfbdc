"""``async def`` steps and compensations of the test app, mixed with plain ones.

Each async call writes the process, thread and event loop it ran on to the ledger, so a
test can see from any worker process that every async body of one thread ran on one loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from celery_saga import Saga, SagaContext


def where() -> str:
    """The process, thread and running loop of the caller, as one ledger detail."""
    loop = asyncio.get_running_loop()
    return f"pid={os.getpid()} thread={threading.get_ident()} loop={id(loop)}"


def define(test_app: Any) -> None:
    fwd, rev = test_app.forward, test_app.reverse

    async def fetch_quote(ctx: SagaContext) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        test_app.write(ctx, "forward_async", where())
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        if plan.get("fail"):
            raise ValueError(f"no quote for order {ctx.input.get('order')}")
        return {"quote": ctx.input.get("order", 0) * 10, "key": ctx.idempotency_key}

    async def release_quote(ctx: SagaContext) -> None:
        await asyncio.sleep(0.01)
        test_app.write(ctx, "compensate_async", f"{where()} result={ctx.forward_result!r}")

    async def book(order: int) -> str:  # input keys map onto an async function's parameters
        await asyncio.sleep(0)
        return f"BOOKED-{order}"

    async def unbook(ctx: SagaContext) -> None:
        test_app.write(ctx, "compensate_async", f"{where()} result={ctx.forward_result!r}")

    async def stall(ctx: SagaContext) -> None:
        test_app.write(ctx, "forward_begin", where())
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            test_app.write(ctx, "cancelled", where())
            raise

    async def undo_stall(ctx: SagaContext) -> None:
        test_app.write(ctx, "compensate_begin", where())
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            test_app.write(ctx, "compensate_cancelled", where())
            raise

    def stall_sync(ctx: SagaContext) -> None:  # the same stall, as a plain function
        test_app.write(ctx, "forward_begin", f"attempt={ctx.attempt}")
        time.sleep(8)

    # One step that times out on both its attempts, sync and async: they must end alike.
    for name, body in (("timeout_sync", stall_sync), ("timeout_async", stall)):
        test_app.engine.register(
            Saga(name)
            .step("prep", fwd, compensate=rev)
            .step("stall", body, timeout=1, retry=2, backoff=0.05)
        )
    test_app.engine.register(
        Saga("async_mixed")
        .step("prep", fwd, compensate=rev)
        .step("fetch", fetch_quote, compensate=release_quote)
        .step("book", book, compensate=unbook)
        .step("plain", fwd, compensate=release_quote)
        .step("last", fetch_quote),
        Saga("async_timed")
        .step("prep", fwd, compensate=rev)
        .step("stall", stall, compensate=release_quote, timeout=1),
        Saga("async_undo_timed")
        .step("hold", book, compensate=undo_stall, compensation_timeout=1, compensation_retry=1)
        .step("refuse", fwd),
    )
