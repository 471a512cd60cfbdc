"""The engine an exploration runs on: the embedded default, built for it and torn down after.

A Celery app of its own on the in-memory broker, a SQLite store in a temporary folder, an
embedded worker (threads pool) and a ``ControlledClock``, so wait deadlines pass when the
explorer says. The explored sagas are registered as ``rebuild.explored_saga`` copies, and
the engine's shutdown probe (``runtime/stopping.set_probe``, the seam the worker layer
installs) also recognises ``InjectedInterruption``; the clock, the probe and the payload
codec (which building an engine sets for the process) are put back on the way out.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery

from celery_saga.definition.builder import Saga, SagaDefinition
from celery_saga.runtime import stopping
from celery_saga.runtime.clock import set_clock
from celery_saga.store.codec import current_codec, use_codec
from celery_saga.testing.clock import ControlledClock
from celery_saga.testing.injection import Injector, interrupted_by_explorer
from celery_saga.testing.rebuild import explored_saga
from celery_saga.worker.delivery import stopped_by_worker
from celery_saga.worker.embedded import embedded_worker
from celery_saga.worker.engine import SagaEngine

#: The loggers an exploration quiets (``explore(only=)`` keeps them, to debug one point).
QUIET_LOGGERS = ("celery_saga", "celery.app.trace", "celery.worker", "celery.concurrency")

#: Seconds between two polls of the in-memory broker by the explorer's worker.
BROKER_POLL = 0.005


@dataclass(frozen=True)
class Sandbox:
    engine: SagaEngine
    clock: ControlledClock
    injector: Injector
    #: The explored saga as the user defined it (its copy runs under the same name).
    definition: SagaDefinition


def _stopping_or_injected(error: BaseException) -> bool:
    return interrupted_by_explorer(error) or stopped_by_worker(error)


@contextmanager
def sandbox(
    saga: Saga,
    children: Sequence[Saga],
    fakes: Mapping[str, Any],
    concurrency: int,
    borrowed: tuple[SagaEngine, ControlledClock] | None = None,
    quiet: bool = True,
) -> Iterator[Sandbox]:
    """Register copies of ``children`` and ``saga`` on a fresh embedded engine, or on the
    ``borrowed`` engine (whose worker runs already) with its clock; ``quiet``: the engine's
    and Celery's logs of the injected failures are left out."""
    with ExitStack() as stack:
        if quiet:
            _quiet(stack)
        if borrowed is None:
            engine, clock = _fresh_engine(stack, concurrency)
        else:
            engine, clock = borrowed
        injector = Injector(engine.app, engine.hooks, engine.db, clock)
        stack.callback(injector.close)
        for each in (*children, saga):
            engine.register(explored_saga(each.seal(), injector, fakes))
        stopping.set_probe(_stopping_or_injected)
        stack.callback(stopping.set_probe, stopped_by_worker)
        yield Sandbox(engine, clock, injector, saga.seal())


def _quiet(stack: ExitStack) -> None:
    """Each injected failure is logged by the engine and by Celery, with its traceback:
    thousands of lines, and most of an exploration's time on a loaded machine."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.CRITICAL)


def _fresh_engine(stack: ExitStack, concurrency: int) -> tuple[SagaEngine, ControlledClock]:
    """An engine on the embedded default, its worker started, torn down by ``stack``."""
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="saga-explore-"))
    name = f"saga-explore-{uuid.uuid4().hex[:10]}"
    app = Celery(name, broker="memory://localhost/", set_as_current=False)
    app.conf.update(
        task_default_queue=name,
        saga_store_url=f"sqlite:///{folder}/explore.sqlite3",
        broker_transport_options={"polling_interval": BROKER_POLL},
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    stack.callback(use_codec, current_codec())  # an engine sets the process's codec
    engine = SagaEngine(app)
    engine.ensure_schema()
    stack.callback(engine.db.dispose)
    clock = ControlledClock()
    stack.callback(set_clock, set_clock(clock))
    stack.enter_context(embedded_worker(app, concurrency=concurrency, hostname=f"{name}@localhost"))
    return engine, clock
