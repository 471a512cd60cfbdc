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
