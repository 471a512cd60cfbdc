"""Ordinary Celery tasks; the sagas use them unchanged or with a default compensation."""

from __future__ import annotations

from typing import Any

from celery_saga import SagaContext, compensated_by
from example_project.app import app

#: Flipped by the demo to make the warehouse refuse (and later accept) a stock release.
WAREHOUSE = {"accepts_releases": True}


@app.task
def release_stock(order_id: str, result: dict[str, Any]) -> None:
    if not WAREHOUSE["accepts_releases"]:
        raise ConnectionError("warehouse API unreachable")


@compensated_by(release_stock)
@app.task
def reserve_stock(order_id: str, items: list[str]) -> dict[str, Any]:
    return {"reservation": f"R-{order_id}", "items": items}


@app.task
def refund_card(ctx: SagaContext) -> None:
    # The refund is keyed by our own key and names the charge it reverses.
    assert ctx.forward_key is not None


@app.task
def charge_card(ctx: SagaContext) -> dict[str, Any]:
    return {"charge_id": f"CH-{ctx.input['order_id']}", "key": ctx.idempotency_key}


@app.task
def ship_order(order_id: str, fail_shipping: bool = False) -> str:
    if fail_shipping:
        raise RuntimeError(f"carrier rejected order {order_id}")
    return f"SHIP-{order_id}"
