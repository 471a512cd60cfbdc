"""The Celery app the behaviour tests run, in-process or in `celery worker` subprocesses.

Steps and compensations write to a ledger table keyed by idempotency key, so a test can see
from any process what ran and how often. Switch rows let a test steer a worker process
(make a reversal fail, then succeed after resume).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    insert,
    select,
    text,
)
from sqlalchemy.pool import NullPool

from celery_saga import (
    Limit,
    Rate,
    Saga,
    SagaContext,
    SagaEngine,
    compensated_by,
    fencing_token,
    path,
    step,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.definition.nodes import StepSpec
from celery_saga.worker.publisher import CeleryPublisher
from tests import async_steps, celery_features, held_sagas, paused_sagas, redaction_sagas
from tests.faults import request_cut

RESULTS_URL = os.environ.get("SAGA_TEST_RESULTS", "redis://127.0.0.1:6379/5")

test_metadata = MetaData()
ledger = Table(
    "test_ledger",
    test_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", String(64)),
    Column("step", String(200)),
    Column("direction", String(32)),
    Column("key", String(400)),
    Column("forward_key", String(400)),
    Column("detail", Text),
)
#: A downstream system that refuses stale writers: the largest fencing token per key.
fenced = Table(
    "test_fenced",
    test_metadata,
    Column("key", String(400), primary_key=True),
    Column("token", Integer, nullable=False),
    Column("detail", Text),
)
switches = Table(
    "test_switches",
    test_metadata,
    Column("name", String(200), primary_key=True),
)


class DuplicatingPublisher(CeleryPublisher):
    """Sends every message twice: at-least-once delivery at its worst, to racing workers."""

    def publish_node(
        self,
        saga_name: str,
        spec: StepSpec | None,
        message: NodeMessage,
        countdown: float | None = None,
        label: str | None = None,
        version: str | None = None,
    ) -> None:
        for _ in range(2):
            super().publish_node(saga_name, spec, message, countdown, label, version)

    def publish_compensation(
        self,
        saga_name: str,
        spec: StepSpec | None,
        execution_id: str,
        step_name: str,
        attempt: int,
        countdown: float | None = None,
        version: str | None = None,
    ) -> None:
        for _ in range(2):
            super().publish_compensation(
                saga_name, spec, execution_id, step_name, attempt, countdown, version
            )


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot describe itself")


def _misbehave(plan: dict[str, Any]) -> None:
    """Ways a body can end that are not an ordinary exception (guarantee 27)."""
    if plan.get("exit"):
        raise SystemExit(plan["exit"])
    if plan.get("hard_exit"):
        os._exit(plan["hard_exit"])
    if plan.get("unprintable"):
        raise Unprintable()


def _carrier(saga_input: Any) -> str:
    return str(saga_input["carrier"])


class TestApp:
    """One app + engine + ledger, built for a given broker, store and queue."""

    __test__ = False  # not a test class, despite the name

    def __init__(
        self, broker: str, store: str, queue: str, duplicate: bool = False, reset: bool = False
    ) -> None:
        self.app = Celery("sagaapp", set_as_current=False)
        self.app.conf.update(
            broker_url=broker,
            task_default_queue=queue,
            saga_store_url=store,
            broker_transport_options={"polling_interval": 0.01},
            worker_hijack_root_logger=False,
            worker_prefetch_multiplier=1,
            # Crash tests shorten leases so a killed worker's claim expires quickly.
            saga_lease_seconds=float(os.environ.get("SAGA_TEST_LEASE", "20")),
            saga_compensation_timeout=4,
            # Crash tests run a real `celery beat` with short sweeps.
            saga_recover_after=float(os.environ.get("SAGA_TEST_RECOVER_AFTER", "60")),
            saga_recover_interval=float(
                os.environ.get(
                    "SAGA_TEST_RECOVER_INTERVAL", os.environ.get("SAGA_TEST_SWEEP_INTERVAL", "30")
                )
            ),
            saga_timer_interval=float(os.environ.get("SAGA_TEST_SWEEP_INTERVAL", "5")),
            # Steps are the user's tasks: their results reach a backend as a plain call's do.
            result_backend="cache+memory://" if broker.startswith("memory") else RESULTS_URL,
        )
        self.engine = SagaEngine(self.app)
        if duplicate:
            # The runtime holds its publisher in its frozen parts: the engine's own one
            # becomes a duplicating one (it adds no state, only sends twice).
            single = self.engine.executor.publisher
            assert type(single) is CeleryPublisher
            single.__class__ = DuplicatingPublisher
        # NullPool: worker processes fork after import, and a pooled connection inherited
        # by two pool children would interleave their statements on one socket.
        # Fault tests reach the store through a proxy they cut; the ledger (the steps'
        # effects) goes straight to the database so a cut never fails a body.
        ledger_url = os.environ.get("SAGA_TEST_LEDGER") or store
        self.sql = (
            create_engine(ledger_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
            if "sqlite" not in ledger_url
            else create_engine(ledger_url, connect_args={"timeout": 30}, poolclass=NullPool)
        )
        if reset:
            test_metadata.drop_all(self.sql)
        test_metadata.create_all(self.sql)
        self._define()

    # -- ledger and switches ------------------------------------------------------------
    def write(self, ctx: SagaContext, direction: str, detail: str = "") -> None:
        with self.sql.begin() as connection:
            connection.execute(
                insert(ledger).values(
                    execution_id=ctx.execution_id,
                    step=ctx.step_name,
                    direction=direction,
                    key=ctx.idempotency_key,
                    forward_key=ctx.forward_key,
                    detail=detail,
                )
            )

    def fenced_write(self, key: str, token: int, detail: str) -> bool:
        """Write ``detail`` under ``key`` unless a larger fencing token wrote there already
        (PostgreSQL's upsert with a condition); False: refused as stale."""
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        statement = pg_insert(fenced).values(key=key, token=token, detail=detail)
        statement = statement.on_conflict_do_update(
            index_elements=[fenced.c.key],
            set_={"token": statement.excluded.token, "detail": statement.excluded.detail},
            where=fenced.c.token <= statement.excluded.token,
        )
        with self.sql.begin() as connection:
            return connection.execute(statement.returning(fenced.c.key)).first() is not None

    def entries(self, execution_id: str) -> list[Any]:
        with self.sql.begin() as connection:
            return list(
                connection.execute(
                    select(ledger)
                    .where(ledger.c.execution_id == execution_id)
                    .order_by(ledger.c.id)
                )
            )

    def lose_claim(self, ctx: SagaContext) -> None:
        """What a database crash does to a first claim committed without its flush: the
        step's record is gone while its body runs on (the ledger must be the store)."""
        from celery_saga.store.tables import step_records

        with self.sql.begin() as connection:
            connection.execute(
                step_records.delete().where(
                    step_records.c.execution_id == ctx.execution_id,
                    step_records.c.name == ctx.step_name,
                )
            )

    def switch_on(self, name: str) -> bool:
        with self.sql.begin() as connection:
            return (
                connection.execute(select(switches.c.name).where(switches.c.name == name)).first()
                is not None
            )

    def set_switch(self, name: str, on: bool) -> None:
        with self.sql.begin() as connection:
            connection.execute(switches.delete().where(switches.c.name == name))
            if on:
                connection.execute(insert(switches).values(name=name))

    # -- behaviour driven by the saga input ----------------------------------------------
    def forward(self, ctx: SagaContext) -> Any:
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        if plan.get("mark_begin"):
            at = f" at={time.time():.6f}" if plan.get("stamp") else ""
            self.write(ctx, "forward_begin", f"attempt={ctx.attempt}{at}")
        if plan.get("lose_claim"):
            self.lose_claim(ctx)
        if plan.get("query_sleep"):  # inside a query (PostgreSQL's) when a stop comes
            with self.sql.begin() as connection:
                connection.execute(text("SELECT pg_sleep(:s)"), {"s": plan["query_sleep"]})
        if plan.get("fenced"):
            self.fenced_write(ctx.idempotency_key, fencing_token(), f"attempt={ctx.attempt}")
        pause = plan.get("sleep", 0) + (plan.get("first_sleep", 0) if ctx.attempt == 1 else 0)
        if plan.get("tick"):  # alive marks while it runs: two attempts must never interleave
            ends = time.monotonic() + pause
            while time.monotonic() < ends:
                self.write(ctx, "tick", f"attempt={ctx.attempt}")
                time.sleep(0.2)
        else:
            time.sleep(pause)
        self.write(ctx, "forward", f"attempt={ctx.attempt}")
        _misbehave(plan)
        if plan.get("fail_after_cut"):  # the failure's record meets the outage
            request_cut(int(os.environ["SAGA_TEST_FAULT_CONTROL"]), plan["fail_after_cut"])
            raise ValueError(f"{ctx.step_name} refused order {ctx.input.get('order')}")
        if plan.get("fail_attempts", 0) >= ctx.attempt or plan.get("fail"):
            raise ValueError(f"{ctx.step_name} refused order {ctx.input.get('order')}")
        if plan.get("cut_after"):
            request_cut(int(os.environ["SAGA_TEST_FAULT_CONTROL"]), plan["cut_after"])
        return {"step": ctx.step_name, "attempt": ctx.attempt}

    def reverse(self, ctx: SagaContext) -> None:
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        if plan.get("undo_mark_begin"):
            self.write(ctx, "compensate_begin", f"attempt={ctx.attempt}")
        first = plan.get("undo_first_sleep", 0) if ctx.attempt == 1 else 0
        time.sleep(plan.get("undo_sleep", 0) + first)
        switch = plan.get("undo_switch")
        if switch and self.switch_on(switch):
            self.write(ctx, "compensate_failed")
            raise ConnectionError(f"cannot undo {ctx.step_name}")
        self.write(ctx, "compensate", repr(ctx.forward_result))
        if plan.get("undo_hard_exit"):
            os._exit(plan["undo_hard_exit"])
        if plan.get("cut_after_undo"):
            request_cut(int(os.environ["SAGA_TEST_FAULT_CONTROL"]), plan["cut_after_undo"])

    def forward_item(self, ctx: SagaContext) -> Any:
        """A for_each body: records which item and iteration it ran with."""
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        time.sleep(plan.get("first_sleep", 0) if ctx.attempt == 1 else 0)
        self.write(ctx, "forward", f"item={ctx.item!r} iteration={ctx.iteration}")
        if plan.get("fail"):
            raise ValueError(f"cannot pack {ctx.item!r}")
        return {"packed": ctx.item, "iteration": ctx.iteration}

    def reverse_item(self, ctx: SagaContext) -> None:
        plan = ctx.input.get("plan", {}).get(ctx.step_name, {})
        time.sleep(plan.get("undo_first_sleep", 0) if ctx.attempt == 1 else 0)
        detail = f"item={ctx.item!r} iteration={ctx.iteration} result={ctx.forward_result!r}"
        self.write(ctx, "compensate", detail)

    def after_signal(self, ctx: SagaContext) -> Any:
        """Runs after a gate: records the signals it was given."""
        self.write(ctx, "forward", repr(dict(sorted(ctx.signals.items()))))
        return {"signals": dict(ctx.signals)}

    def _define(self) -> None:
        app, this = self.app, self

        @app.task(name="sagaapp.undo_s1", shared=False)
        def undo_s1(ctx: SagaContext) -> None:
            this.reverse(ctx)

        @compensated_by(undo_s1)
        @app.task(name="sagaapp.s1", shared=False)
        def s1(ctx: SagaContext) -> Any:
            return this.forward(ctx)

        @app.task(name="sagaapp.s2", shared=False)
        def s2(ctx: SagaContext) -> Any:
            return this.forward(ctx)

        self.tasks = {"s1": s1, "s2": s2, "undo_s1": undo_s1}
        fwd, rev = self.forward, self.reverse
        self.engine.register(
            Saga("five")
            .step(s1)
            .step(s2, compensate=rev)
            .step("s3", fwd, compensate=rev, retry=2, backoff=0.05)
            .step("s4", fwd)
            .step("s5", fwd, compensate=rev),
            Saga("failed_eligible").step("a", fwd, compensate=rev).step("b", fwd, compensate=rev),
            Saga("four_back")
            .step("a", fwd, compensate=rev)
            .step("b", fwd, compensate=rev)
            .step("c", fwd, compensate=rev, compensation_retry=1)
            .step("d", fwd, compensate=rev)
            .step("e", fwd),
            Saga("fanout")
            .step("first", fwd, compensate=rev)
            .parallel(
                "group",
                step("p1", fwd, compensate=rev),
                step("p2", fwd, compensate=rev),
                step("p3", fwd, compensate=rev),
            )
            .step("last", fwd, compensate=rev),
            Saga("pivoted").step("a", fwd, compensate=rev).pivot().step("b", fwd, compensate=rev),
            Saga("slow_retry").step("a", fwd, retry=2, backoff=6.0),
            Saga("routed")
            .map("total", lambda ctx: sum(ctx.input["amounts"]))
            .branch(
                "size",
                lambda ctx: "big" if ctx.results["total"] > 100 else "small",
                path("big", step("review", fwd, compensate=rev), step("approve", fwd)),
                path("small", step("auto", fwd)),
            )
            .step("done", fwd),
            Saga("misrouted").branch("size", lambda ctx: "huge", path("small", step("x", fwd))),
            Saga("hanging").step("a", fwd, compensate=rev, compensation_retry=1).step("b", fwd),
            Saga("long").step("marathon", fwd),
            # Flow control: one live run per customer (tests/test_flow_workers.py).
            Saga("keyed", concurrency=Limit(key=lambda i: i["customer"], max=1)).step("pay", fwd),
            Saga("pair_keyed", concurrency=Limit(key=lambda i: i["customer"], max=2)).step(
                "pay", fwd
            ),
            # Step flow control: five calls in flight, or 20 a second, per carrier
            # (tests/test_step_flow_workers.py).
            Saga("carrier_calls")
            .step("prep", fwd)
            .step("call", fwd, concurrency=Limit(key=lambda i: i["carrier"], max=5)),
            Saga("carrier_rated").step("call", fwd, rate=Rate("20/s", key=lambda i: i["carrier"])),
            Saga("carrier_pairs").step("call", fwd, concurrency=Limit(key=_carrier, max=2)),
            Saga("timed")
            .step("prep", fwd, compensate=rev)
            .step("slow", fwd, compensate=rev, timeout=5, retry=2, backoff=0.05),
            Saga("exiting")
            .step("prep", fwd, compensate=rev)
            .step("quit", fwd, compensate=rev, retry=2, backoff=0.05),
        )
        self._define_control_flow()
        celery_features.define(self)
        held_sagas.define(self)
        paused_sagas.define(self)
        async_steps.define(self)

    def _define_control_flow(self) -> None:
        fwd, rev = self.forward, self.reverse
        item, unitem = self.forward_item, self.reverse_item

        def rounds_done(ctx: SagaContext) -> bool:  # ctx.iteration: iterations done so far
            return bool(ctx.iteration >= ctx.input.get("rounds", 1))

        def rounds_left(ctx: SagaContext) -> bool:
            return bool(ctx.iteration < ctx.input.get("rounds", 0))

        def child_input(ctx: SagaContext) -> dict[str, Any]:
            return {"order": ctx.input.get("order"), "plan": ctx.input.get("child_plan", {})}

        self.engine.register(
            Saga("approval")
            .step("reserve", fwd, compensate=rev)
            .step("charge", fwd, compensate=rev)
            .wait_for("approved", timeout=float(os.environ.get("SAGA_TEST_WAIT", "2")))
            .step("ship", self.after_signal),
            Saga("two_gates")
            .wait_for("first")
            .step("between", fwd, compensate=rev)
            .wait_for("second")
            .step("after", self.after_signal),
            Saga("batch")
            .step("open", fwd, compensate=rev)
            .for_each(lambda ctx: ctx.input["items"], step("pack", item, compensate=unitem))
            .step("seal", fwd),
            Saga("polling")
            .do_until(rounds_done, step("poll", fwd, compensate=rev), max_iterations=5)
            .step("report", fwd),
            Saga("guarded")
            .do_while(
                rounds_left,
                [step("check", fwd, compensate=rev), step("act", fwd)],
                max_iterations=5,
            )
            .step("end", fwd),
            Saga("child").step("c1", fwd, compensate=rev).step("c2", fwd, compensate=rev),
            Saga("parent")
            .step("p1", fwd, compensate=rev)
            .sub_saga("child", input=child_input)
            .step("p2", fwd),
            Saga("gated_child").step("g1", fwd, compensate=rev).wait_for("go").step("g2", fwd),
            Saga("gated_parent").sub_saga("gated_child").step("after", fwd),
            Saga("committed_child").step("k1", fwd, compensate=rev).pivot().step("k2", fwd),
            Saga("committing_parent")
            .step("z0", fwd, compensate=rev)
            .sub_saga("committed_child", input=child_input)
            .step("z1", fwd),
            # A gate in every position: alone, last, and last inside a child that is itself
            # the parent's last node (so one signal completes both runs).
            Saga("gate_only").wait_for("go"),
            # What the run page's timeline picture must draw (tests/test_web_timeline.py).
            Saga("pictured")
            .step("reserve", fwd, compensate=rev)
            .step("charge", fwd, compensate=rev, retry=4, backoff=0.3)
            .step("pack", fwd, compensate=rev)
            .step("label", fwd, compensate=rev)
            .wait_for("approved")
            .step("ship", fwd),
            Saga("gate_last").step("a", fwd, compensate=rev).wait_for("go"),
            Saga("gate_last_child").step("c", fwd, compensate=rev).wait_for("done"),
            Saga("gate_last_parent").step("p", fwd, compensate=rev).sub_saga("gate_last_child"),
            *redaction_sagas.define(self),
        )


def from_environment() -> TestApp:
    test_app = TestApp(
        broker=os.environ["SAGA_TEST_BROKER"],
        store=os.environ["SAGA_TEST_STORE"],
        queue=os.environ["SAGA_TEST_QUEUE"],
        duplicate=os.environ.get("SAGA_TEST_DUPLICATE") == "1",
    )
    if os.environ.get("SAGA_TEST_METRICS_PORT"):
        from celery_saga.metrics import enable_metrics

        port = int(os.environ["SAGA_TEST_METRICS_PORT"])
        enable_metrics(test_app.engine, port=port, address="127.0.0.1")
    return test_app


if "SAGA_TEST_BROKER" in os.environ:
    app = from_environment().app
