"""Ordinary Celery tasks; the sagas use them unchanged or with a default compensation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery_saga import SagaContext, compensated_by
from example_project.app import app
from example_project.failures import CourierUnreachable, ShippingRefused, WarehouseUnreachable

#: The demo's warehouse outage: while this file exists in the working directory, releasing
#: stock fails. A file, so that workers started from the same directory (``--no-worker``)
#: see the outage too, not only the process that runs the demo.
WAREHOUSE_DOWN = Path("example-warehouse-down")
#: The demo's courier outage, the same way: while this file exists, booking a pickup fails.
COURIER_DOWN = Path("example-courier-down")


@app.task
def release_item(order_id: str, item: str, result: dict[str, Any]) -> None:
    if WAREHOUSE_DOWN.exists():
        raise WarehouseUnreachable(f"warehouse API unreachable (releasing {item})")


@compensated_by(release_item)
@app.task
def reserve_item(order_id: str, item: str, iteration: int) -> dict[str, Any]:
    return {"reservation": f"R-{order_id}-{iteration}", "item": item}


@app.task
def authorize(ctx: SagaContext) -> dict[str, Any]:
    return {"authorization": f"AU-{ctx.input['order_id']}", "amount": ctx.input["amount"]}


@app.task
def void_authorization(ctx: SagaContext) -> None:
    assert ctx.forward_key is not None  # the void names the authorization it reverses


@app.task
def capture(ctx: SagaContext) -> dict[str, Any]:
    return {"charge_id": f"CH-{ctx.input['order_id']}", "key": ctx.idempotency_key}


@app.task
def refund(ctx: SagaContext) -> None:
    # The refund is keyed by our own key and names the charge it reverses.
    assert ctx.forward_key is not None


@app.task
def ship_order(order_id: str, fail_shipping: bool = False) -> str:
    if fail_shipping:
        raise ShippingRefused(f"carrier rejected order {order_id}")
    return f"SHIP-{order_id}"


@app.task
def book_courier(order_id: str) -> str:
    if COURIER_DOWN.exists():
        raise CourierUnreachable(f"courier API unreachable (booking a pickup for {order_id})")
    return f"PICKUP-{order_id}"


@app.task
def cancel_courier(order_id: str) -> None:
    return None
