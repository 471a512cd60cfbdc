"""The saga definitions of the example."""

from __future__ import annotations

from typing import Any

from celery_saga import Saga, SagaContext
from example_project.app import engine
from example_project.tasks import charge_card, refund_card, reserve_stock, ship_order


def send_receipt(ctx: SagaContext) -> str:
    return f"receipt for {ctx.results['charge_card']['charge_id']}"


def order_total(ctx: SagaContext) -> Any:
    return len(ctx.input["items"]) * 10


order = (
    Saga("order")
    .step(reserve_stock, compensation_retry=1)
    .map("total", order_total)
    .step(charge_card, compensate=refund_card)
    .step(ship_order, retry=2, backoff=0.05)
    .step("send_receipt", send_receipt)
)

engine.register(order)
