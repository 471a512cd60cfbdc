"""A Celery app whose payload keys come from the environment, for the key rotation test:
``SAGA_TEST_PAYLOAD_KEYS`` (JSON: key id -> key) and ``SAGA_TEST_PAYLOAD_KEY`` (newest)."""

from __future__ import annotations

import json
import os
import time

from celery import Celery

from celery_saga import Saga, SagaContext, SagaEngine


def reserve(ctx: SagaContext) -> dict[str, str]:
    time.sleep(0.02)
    return {"token": ctx.input["card"]}


def charge(ctx: SagaContext) -> str:
    time.sleep(0.02)
    return "charged " + ctx.results["reserve"]["token"]


def release(ctx: SagaContext) -> None:
    return None


def make_app(broker: str, store: str, queue: str, keys: dict[str, str], newest: str) -> SagaEngine:
    app = Celery("vault", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        task_default_queue=queue,
        saga_store_url=store,
        saga_payload_keys=keys,
        saga_payload_key=newest,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    engine = SagaEngine(app)
    engine.register(
        Saga("vault_rotate")
        .step("reserve", reserve, compensate=release)
        .wait_for("confirmed", timeout=300)
        .step("charge", charge)
    )
    return engine


if "SAGA_TEST_PAYLOAD_KEYS" in os.environ:
    app = make_app(
        os.environ["SAGA_TEST_BROKER"],
        os.environ["SAGA_TEST_STORE"],
        os.environ["SAGA_TEST_QUEUE"],
        json.loads(os.environ["SAGA_TEST_PAYLOAD_KEYS"]),
        os.environ["SAGA_TEST_PAYLOAD_KEY"],
    ).app
