"""Celery app imported by BOTH the benchmark driver and its `celery worker` subprocess.

It defines the two workloads compared by ``chain_vs_saga.py``:

(A) ``bench.write``: a plain Celery task that does exactly one PostgreSQL write (an INSERT
    into ``bench_writes`` through its own SQLAlchemy engine). Five of them run as a
    ``celery.chain`` of immutable signatures. The row written by the fifth task
    (``seq = 4``) is the chain's completion marker; no result backend is used.
(B) ``bench_five``: a saga of five no-op plain-function steps on a ``SagaEngine`` whose
    store is PostgreSQL.
(C) ``bench_unwind``: the same five steps, but the fifth raises, so the run unwinds through
    four reversals (``bench_unwind.s4.compensate`` ... ``s1.compensate``, all no-ops) and
    ends ``failed``. The fifth step has no compensation: exactly 4 reversals.
(D) ``bench.fail``: a plain Celery task that does the INSERT of (A), then raises: the
    baseline of a failure's cost in Celery itself (the RSS phase).
(F) ``bench_signal`` (two no-op steps around ``wait_for("go")``) and ``bench_loop`` (a
    ``for_each`` over three items with compensations, then a ``do_until`` of two
    iterations): the RSS phase's signal and loop paths.
(E) the plain analog of (C): a ``celery.chain`` of 4 ``bench.write`` and a ``bench.fail``,
    with ``link_error`` into a chain of 4 ``bench.write`` (the compensations, rows 5 to 8).
    The row of the last compensation (``seq = UNDO_LAST_SEQ``) marks its end.

Everything a run must isolate comes from the environment, which the driver sets before
importing this module and passes on to the worker:

``BENCH_BROKER_URL``  broker (default ``amqp://guest:guest@127.0.0.1:5672//``; a
                      ``redis://`` URL works the same way)
``BENCH_STORE_URL``   PostgreSQL URL (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
``BENCH_SCHEMA``      PostgreSQL schema that holds every table of this run (saga store and
                      ``bench_writes``), selected through ``search_path``
``BENCH_QUEUE``       the one queue used by chain tasks and saga nodes
``BENCH_PROFILE``     ``1`` installs the per-task instrumentation of ``bench_profile``
``BENCH_CHAIN_ACKS_LATE``  ``1`` gives the chain task ``acks_late`` + ``reject_on_worker_lost``;
                      default ``0`` (plain Celery, as the saga's step tasks)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import tracing_modes
from bench_infra import WRITE_SQL
from celery import Celery
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from celery_saga import Saga, SagaContext, SagaEngine, step

DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_STORE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

BROKER_URL = os.environ.get("BENCH_BROKER_URL") or DEFAULT_BROKER_URL
BASE_STORE_URL = os.environ.get("BENCH_STORE_URL") or DEFAULT_STORE_URL
SCHEMA = os.environ.get("BENCH_SCHEMA") or "celery_saga_bench"
QUEUE = os.environ.get("BENCH_QUEUE") or "celery_saga_bench"
CHAIN_ACKS_LATE = os.environ.get("BENCH_CHAIN_ACKS_LATE", "0") == "1"
PROFILE = os.environ.get("BENCH_PROFILE", "0") == "1"
#: ``off`` (``saga_tracing = False``), ``api`` (the OpenTelemetry API, no SDK: the
#: setting's default finds no tracer provider), ``sdk`` (an SDK provider whose exporter
#: drops every span): see ``tracing_modes``.
TRACING = os.environ.get("BENCH_TRACING", "off")
#: ``1``: runs whose execution id starts with ``TRACED`` are traced as ``TRACING``, every
#: other run is not (``saga_tracing = False``), in the same processes (``trace_as``).
TRACING_AB = os.environ.get("BENCH_TRACING_AB", "0") == "1"
TRACED = "t"

SAGA_NAME = "bench_five"
UNWIND_NAME = "bench_unwind"
SIGNAL_NAME = "bench_signal"
LOOP_NAME = "bench_loop"
SIGNAL_EVENT = "go"
LOOP_ITEMS = ["a", "b", "c"]
STEPS_PER_RUN = 5
WRITES_TABLE = "bench_writes"


def scoped_url(url: str = BASE_STORE_URL, schema: str = SCHEMA) -> str:
    """``url`` with ``search_path`` set to ``schema``: every unqualified table lives there."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise SystemExit(f"BENCH_STORE_URL must be a PostgreSQL URL, got {url!r}")
    query = dict(parsed.query)
    query["options"] = f"-csearch_path={schema}"
    return parsed.update_query_dict(query).render_as_string(hide_password=False)


STORE_URL = scoped_url()

app = Celery("bench_app")
app.conf.update(
    broker_url=BROKER_URL,
    result_backend=None,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    saga_queue=QUEUE,
    saga_store_url=STORE_URL,
    worker_send_task_events=False,
    task_send_sent_event=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=3,
)

if PROFILE:
    import bench_profile

    bench_profile.count_store_statements()

TRACED_SETTING = tracing_modes.setting(TRACING)
app.conf.saga_tracing = TRACED_SETTING

engine = SagaEngine(app, store_url=STORE_URL)


def trace_as(execution_id: str) -> None:
    """With ``TRACING_AB``: the engine of this process traces the run ``execution_id`` as
    ``TRACING`` if its id starts with ``TRACED``, else not at all. The setting is what the
    engine's tracer reads at each span boundary; a pool process runs one message at a time."""
    traced = execution_id.startswith(TRACED)
    engine.parts.tracer.setting = TRACED_SETTING if traced else False


if TRACING_AB:
    from celery.signals import task_prerun

    from celery_saga.worker.saga_header import read_header

    if TRACING == "off":
        raise SystemExit("BENCH_TRACING_AB=1 compares off with api or sdk, not with off")

    @task_prerun.connect(weak=False)
    def _trace_this_run(task: Any = None, **_: Any) -> None:
        """Every message of a run, a plain chain task's too (it has no header): the same
        work for both kinds of run."""
        header = read_header(task.request) if task is not None else None
        trace_as(header["id"] if header else "")


# --- (A) the plain task and its own lazily created, fork-safe SQLAlchemy engine ----------
_db_lock = threading.Lock()
_db: dict[str, Any] = {"engine": None, "pid": None}


def _forget_engine_after_fork() -> None:
    stale = _db["engine"]
    if stale is not None:
        stale.dispose(close=False)  # never reuse the parent's sockets
    _db["engine"], _db["pid"] = None, None


os.register_at_fork(after_in_child=_forget_engine_after_fork)


def bench_db() -> Engine:
    """This process's engine for the benchmark table (created on first use)."""
    with _db_lock:
        if _db["engine"] is None or _db["pid"] != os.getpid():
            _db["engine"] = create_engine(STORE_URL, pool_size=2, max_overflow=2)
            _db["pid"] = os.getpid()
        return _db["engine"]  # type: ignore[no-any-return]


_CHAIN_TASK_OPTIONS: dict[str, Any] = {"ignore_result": True}
if CHAIN_ACKS_LATE:
    _CHAIN_TASK_OPTIONS.update(acks_late=True, reject_on_worker_lost=True)


_WRITE = text(WRITE_SQL.format(table=WRITES_TABLE))


def insert_row(run_id: str, batch: str, seq: int) -> None:
    with bench_db().begin() as connection:
        connection.execute(_WRITE, {"r": run_id, "b": batch, "s": seq})


@app.task(name="bench.write", **_CHAIN_TASK_OPTIONS)
def bench_write(run_id: str, batch: str, seq: int) -> None:
    """One INSERT; the row with ``seq = STEPS_PER_RUN - 1`` marks the chain as finished."""
    insert_row(run_id, batch, seq)


@app.task(name="bench.fail", **_CHAIN_TASK_OPTIONS)
def bench_fail(run_id: str, batch: str) -> None:
    """One INSERT, then an exception: the plain Celery analog of a failing step."""
    insert_row(run_id, batch, STEPS_PER_RUN - 1)
    raise RuntimeError("bench: the plain task fails on purpose")


def chain_signature(run_id: str, batch: str) -> Any:
    from celery import chain

    return chain(*(bench_write.si(run_id, batch, seq) for seq in range(STEPS_PER_RUN)))


#: The row the last compensation of the plain unwind writes (rows 5 to 8: four of them).
UNDO_LAST_SEQ = 2 * STEPS_PER_RUN - 2


def chain_unwind_signature(run_id: str, batch: str) -> Any:
    """4 writes and a failing task; the failure's ``link_error`` runs 4 compensating writes
    as a chain, as a plain Celery application would wire an unwind."""
    from celery import chain

    forward = (bench_write.si(run_id, batch, seq) for seq in range(STEPS_PER_RUN - 1))
    undo = (bench_write.si(run_id, batch, seq) for seq in range(STEPS_PER_RUN, UNDO_LAST_SEQ + 1))
    return chain(*forward, bench_fail.si(run_id, batch)).on_error(chain(*undo))


# --- (B) the saga: five no-op plain-function steps -----------------------------------------
def noop() -> None:
    return None


def undo() -> None:
    return None


def fail() -> None:
    raise RuntimeError("bench: the last step fails on purpose")


bench_saga = Saga(SAGA_NAME)
for _index in range(1, STEPS_PER_RUN + 1):
    bench_saga.step(f"s{_index}", noop)
engine.register(bench_saga)

# --- (C) the unwind: four compensatable no-op steps, then one that fails (no retry) --------
unwind_saga = Saga(UNWIND_NAME)
for _index in range(1, STEPS_PER_RUN):
    unwind_saga.step(f"s{_index}", noop, compensate=undo)
unwind_saga.step(f"s{STEPS_PER_RUN}", fail, retry=1)
engine.register(unwind_saga)

# --- (F) the signal and loop paths of the RSS phase ------------------------------------------
engine.register(Saga(SIGNAL_NAME).step("s1", noop).wait_for(SIGNAL_EVENT).step("s2", noop))


def poll(ctx: SagaContext) -> str:
    return "ready" if ctx.iteration >= 1 else "pending"


def polled_ready(ctx: SagaContext) -> bool:
    return bool(ctx.results["poll"] == "ready")


engine.register(
    Saga(LOOP_NAME)
    .for_each(lambda ctx: ctx.input["items"], step("pick", noop, compensate=undo))
    .do_until(polled_ready, step("poll", poll), max_iterations=5)
)

if PROFILE:
    bench_profile.install(sys.modules[__name__])
