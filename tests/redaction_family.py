"""A family of sagas whose parent and child mark different values sensitive.

``family_parent`` marks its input's ``card``, charges it, then runs ``family_child`` as its
sub-saga ``vault`` (with only the order as input); the child marks ``pin`` and the whole
result of its ``seal`` step. The parent's last step, ``report``, fails when the input asks,
naming the card and the child's pin and token: every failure text has something of both to
hide. Each value is derived from the order, so a test knows what to look for."""

from __future__ import annotations

from typing import Any

from celery_saga import Saga, SagaContext

PARENT, CHILD = "family_parent", "family_child"


def card_of(order: int) -> str:
    return f"4111-7777-{order:04d}-9931"


def pin_of(order: int) -> str:
    return f"PIN-{order}-73519"


def token_of(order: int) -> str:
    return f"tok_vault_{order}_550123"


def secrets_of(order: int) -> list[str]:
    """Every value the family marks, for a run of ``order``."""
    return [card_of(order), pin_of(order), token_of(order)]


def _charge(ctx: SagaContext) -> Any:
    return {"card": ctx.input["card"], "charged": True}


def _refund(ctx: SagaContext) -> None:
    return None


def _open(ctx: SagaContext) -> Any:
    return {"pin": pin_of(ctx.input["order"]), "note": "opened"}


def _seal(ctx: SagaContext) -> Any:
    return {"token": token_of(ctx.input["order"])}


def _report(ctx: SagaContext) -> Any:
    vault = ctx.results["vault"]
    if ctx.input.get("fail"):
        raise ValueError(
            f"report refused card {ctx.input['card']} with pin {vault['open']['pin']} "
            f"and token {vault['seal']['token']}"
        )
    return {"reported": ctx.input["order"]}


def define() -> list[Saga]:
    """The child first: a parent is registered after the sagas it runs."""
    child = Saga(CHILD, sensitive=("pin",)).step("open", _open).step("seal", _seal, sensitive=True)
    parent = (
        Saga(PARENT, sensitive=("card",))
        .step("charge", _charge, compensate=_refund)
        .sub_saga(CHILD, name="vault", input=lambda ctx: {"order": ctx.input["order"]})
        .step("report", _report)
    )
    return [child, parent]


def family_input(order: int, *, fail: bool = False) -> dict[str, Any]:
    return {"order": order, "card": card_of(order), "fail": fail}
