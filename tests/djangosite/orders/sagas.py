from shopsite.celery import engine

from celery_saga import Saga


def reserve(order_id: str) -> str:
    return f"R-{order_id}"


def release(order_id: str) -> None:
    return None


def charge(order_id: str) -> str:
    return f"C-{order_id}"


engine.register(
    Saga("shop-order").step("reserve", reserve, compensate=release).step("charge", charge)
)


#: While True, ``unreserve`` fails: a run of ``shop-fragile`` parks its unwind.
UNDO_BROKEN = {"now": True}


def unreserve(order_id: str) -> None:
    if UNDO_BROKEN["now"]:
        raise RuntimeError(f"the stock service refused to release {order_id}")


def refuse(order_id: str) -> None:
    raise RuntimeError(f"card declined for {order_id}")


engine.register(
    Saga("shop-fragile")
    .step("reserve", reserve, compensate=unreserve, compensation_retry=1)
    .step("charge", refuse, retry=1),
    Saga("shop-approval", sensitive=("card",))
    .step("reserve", reserve, compensate=release)
    .wait_for("approved"),
)
