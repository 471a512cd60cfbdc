"""The saga definitions of the example: an order with a batch reservation, a nested payment
saga and a manager's approval gate; a courier pickup that holds for an operator when the
courier's API is down."""

from __future__ import annotations

import os
from typing import Any

from celery_saga import Saga, SagaContext, step
from example_project.app import engine
from example_project.tasks import (
    authorize,
    book_courier,
    cancel_courier,
    capture,
    refund,
    reserve_item,
    ship_order,
    void_authorization,
)

#: Seconds a manager has to approve; short so the demo's unapproved order times out quickly.
APPROVAL_TIMEOUT = float(os.environ.get("EXAMPLE_APPROVAL_TIMEOUT", "2"))


def order_total(ctx: SagaContext) -> Any:
    return len(ctx.input["items"]) * 10


def payment_input(ctx: SagaContext) -> dict[str, Any]:
    return {"order_id": ctx.input["order_id"], "amount": ctx.results["total"]}


def send_receipt(ctx: SagaContext) -> str:
    approver = ctx.signals["approved"]["by"]
    return f"receipt for {ctx.results['payment']['capture']['charge_id']}, approved by {approver}"


payment = (
    Saga("payment").step(authorize, compensate=void_authorization).step(capture, compensate=refund)
)

order = (
    Saga("order")
    .for_each(lambda ctx: ctx.input["items"], step(reserve_item, compensation_retry=1))
    .map("total", order_total)
    .sub_saga("payment", input=payment_input)
    .wait_for("approved", timeout=APPROVAL_TIMEOUT)
    .step(ship_order, retry=2, backoff=0.05)
    # Shipped goods cannot be unshipped: a receipt that fails must not refund the order.
    .pivot()
    .step("send_receipt", send_receipt)
)

# A courier that is down is not a reason to undo the order: the run holds until an operator
# retries it (or skips or unwinds it), see docs/incidents.md.
courier = Saga("courier").step(
    book_courier, compensate=cancel_courier, retry=2, backoff=0.05, on_failure="hold"
)

engine.register(payment, order, courier)
