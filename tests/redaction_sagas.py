"""Sagas of the test app that carry sensitive data: ``private`` marks its input's ``card`` and
``address`` and the whole result of ``tokenize``; ``private_plain`` is the same saga with no
markings. ``charge`` fails with a message naming the card, the address and the token, and
the first reversal of ``tokenize`` fails naming the token, so every failure text has
something to hide."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_saga import Saga, SagaContext

if TYPE_CHECKING:
    from tests.sagaapp import TestApp


def token_of(order: int) -> str:
    return f"tok_{order}_vaultsecret"


def define(test_app: TestApp) -> list[Saga]:
    this = test_app

    def reserve(ctx: SagaContext) -> Any:
        this.write(ctx, "forward")
        return {"hold": f"hold-{ctx.input['order']}", "card": ctx.input["card"]}

    def release(ctx: SagaContext) -> None:
        this.write(ctx, "compensate")

    def tokenize(ctx: SagaContext) -> Any:
        this.write(ctx, "forward")
        return {"token": token_of(ctx.input["order"])}

    def detokenize(ctx: SagaContext) -> None:
        if ctx.attempt == 1:
            this.write(ctx, "compensate_failed")
            raise ConnectionError(f"vault refused {ctx.forward_result['token']}")
        this.write(ctx, "compensate")

    def charge(ctx: SagaContext) -> None:
        this.write(ctx, "forward")
        card, address = ctx.input["card"], ctx.input["address"]
        token = ctx.results["tokenize"]["token"]
        raise ValueError(f"card {card} at {address} declined (token {token})")

    def saga(name: str, marked: bool) -> Saga:
        return (
            Saga(name, sensitive=("card", "address") if marked else None)
            .step("reserve", reserve, compensate=release)
            .step("tokenize", tokenize, compensate=detokenize, sensitive=marked, backoff=0.05)
            .step("charge", charge)
        )

    return [saga("private", True), saga("private_plain", False)]
