"""The Celery app of the rolling-deploy tests and benchmark: which versions of the sagas
``deploy`` and ``approve`` it registers comes from ``SAGA_TEST_VERSIONS`` ("1", "1,2", "2").

Version 2 of ``deploy`` adds a step (``audit``), removes one (``ship``), renames one
(``charge`` -> ``bill``) and gives ``reserve`` another function under the same step name
(the same task, ``deploy.reserve``, carries both versions). Every body writes a ledger row
keyed by its idempotency key, with the version whose code ran it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert
from sqlalchemy.pool import NullPool

from celery_saga import Saga, SagaContext, SagaEngine, step

ledger_metadata = MetaData()
ledger = Table(
    "test_version_ledger",
    ledger_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", String(64)),
    Column("step", String(200)),
    Column("direction", String(32)),
    Column("key", String(400)),
    Column("code", String(8)),
)
_sql: Any = None


def _write(ctx: SagaContext, direction: str, code: str) -> None:
    with _sql.begin() as connection:
        connection.execute(
            insert(ledger).values(
                execution_id=ctx.execution_id,
                step=ctx.step_name,
                direction=direction,
                key=ctx.idempotency_key,
                code=code,
            )
        )


def _pace(ctx: SagaContext) -> None:
    time.sleep(float(ctx.input.get("pace", 0.05)))


def reserve(ctx: SagaContext) -> str:
    _pace(ctx)
    _write(ctx, "forward", "1")
    return "v1"


def reserve_v2(ctx: SagaContext) -> str:
    _pace(ctx)
    _write(ctx, "forward", "2")
    return "v2"


def work(ctx: SagaContext) -> None:
    _pace(ctx)
    _write(ctx, "forward", "any")
    if ctx.step_name in ("charge", "bill") and ctx.input.get("fail"):
        raise ValueError(f"{ctx.step_name} declined")


def undo(ctx: SagaContext) -> None:
    _pace(ctx)
    if ctx.step_name == ctx.input.get("stuck_at"):  # its unwind parks here
        raise RuntimeError(f"cannot undo {ctx.step_name}")
    _write(ctx, "compensate", "any")


def rounds_done(ctx: SagaContext) -> bool:
    return bool(ctx.iteration >= 2)


def _deploy(version: str) -> Saga:
    saga = (
        Saga("deploy", version=version)
        .step("reserve", reserve if version == "1" else reserve_v2, compensate=undo)
        .parallel("checks", step("fraud", work, compensate=undo), step("stock", work))
        .wait_for("approved")
        .do_until(rounds_done, step("tick", work, compensate=undo), max_iterations=3)
        .sub_saga("pay")
    )
    if version == "1":
        return saga.step("charge", work, compensate=undo).step("ship", work)
    return saga.step("audit", work).step("bill", work, compensate=undo)


def _rollout(version: str) -> Saga:
    """Version 2 adds a first step, ``vet``, whose task (``rollout.vet``) the workers of
    version 1 do not have; ``rollout.apply`` is one task for both versions. Its labels are
    its own (``saga list --version 1`` names ``deploy``'s)."""
    saga = Saga("rollout", version=f"rollout-{version}")
    if version == "2":
        saga = saga.step("vet", work)
    return saga.step("apply", work, compensate=undo)


def _approve(version: str) -> Saga:
    saga = Saga("approve", version=version).step("hold", work, compensate=undo).wait_for("ok")
    saga = saga.step("done", work)
    return saga if version == "1" else saga.step("notify", work)


#: The steps a completed run of each version records (loop iterations as ``tick:<n>``).
DEPLOY_STEPS = {
    "1": {"reserve", "fraud", "stock", "tick:0", "tick:1", "pay", "charge", "ship"},
    "2": {"reserve", "fraud", "stock", "tick:0", "tick:1", "pay", "audit", "bill"},
}


def make_app(broker: str, store: str, queue: str, versions: str) -> SagaEngine:
    global _sql
    app = Celery("versioned", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        task_default_queue=queue,
        saga_store_url=store,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        saga_recover_after=600.0,
    )
    engine = SagaEngine(app)
    _sql = create_engine(store, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    ledger_metadata.create_all(_sql)
    engine.register(Saga("pay").step("card", work, compensate=undo))
    for version in versions.split(","):
        engine.register(_deploy(version), _approve(version), _rollout(version))
    return engine


if "SAGA_TEST_VERSIONS" in os.environ:
    if "SAGA_TEST_SPANS" in os.environ:  # tests/test_tracing_workers.py
        from tests.tracing_kit import trace_to_files

        trace_to_files()
    app = make_app(
        os.environ["SAGA_TEST_BROKER"],
        os.environ["SAGA_TEST_STORE"],
        os.environ["SAGA_TEST_QUEUE"],
        os.environ["SAGA_TEST_VERSIONS"],
    ).app
