from celery import shared_task
from shopsite.celery import engine

from celery_saga import Saga


@shared_task
def notify(order_id: str) -> str:
    return f"notified {order_id}"


# Celery users keep sagas next to their tasks too: this one is found as well.
engine.register(Saga("shop-refund").step(notify))
