"""Per-message cost on PostgreSQL, counted statement by statement (not timed).

A forward step node on the happy path takes two statements (claim, outcome + cursor) of
which only the outcome waits for its WAL flush; a reversal takes no more than a forward
step (claim, outcome + next move), the last one of an unwind included.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import event, select

from celery_saga import Saga, SagaEngine
from celery_saga.store.tables import executions
from tests.conftest import in_process_pg_engine

ASYNC_MARKER = "synchronous_commit"


@dataclass
class Handled:
    """The statements one message handler ran, in order."""

    kind: str
    statements: list[str] = field(default_factory=list)

    def writes(self) -> list[str]:
        return [s for s in self.statements if _writes(s)]

    def synchronous_commits(self) -> int:
        # Each statement runs in autocommit: every write is its own commit, and only the
        # ones that switch synchronous_commit off for themselves skip the WAL flush wait.
        return sum(1 for s in self.writes() if ASYNC_MARKER not in s)


def _writes(statement: str) -> bool:
    head = statement.lstrip().upper()
    return head.startswith(("INSERT", "UPDATE", "DELETE")) or (
        head.startswith("WITH") and ("UPDATE " in head or "INSERT " in head)
    )


def _noop() -> None:
    return None


def _boom() -> None:
    raise RuntimeError("declined")


@contextmanager
def _recording(engine: SagaEngine) -> Iterator[list[Handled]]:
    """Attribute every statement to the message handler running on its thread."""
    handled: list[Handled] = []
    current = threading.local()

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        target = getattr(current, "handled", None)
        if target is not None and not statement.lstrip().upper().startswith("BEGIN"):
            target.statements.append(statement)

    def wrap(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            current.handled = Handled(kind)
            handled.append(current.handled)
            try:
                return method(*args, **kwargs)
            finally:
                current.handled = None

        return wrapped

    executor = engine.executor
    executor.run_node = wrap("node", executor.run_node)  # type: ignore[method-assign]
    unwinder = executor.unwinder
    unwinder.run = wrap("reversal", unwinder.run)  # type: ignore[method-assign]
    engines = [engine.db.engine]
    for sa_engine in engines:
        event.listen(sa_engine, "before_cursor_execute", on_execute)
    try:
        yield handled
    finally:
        for sa_engine in engines:
            event.remove(sa_engine, "before_cursor_execute", on_execute)


def _run_to(engine: SagaEngine, saga: str, state: str) -> list[Handled]:
    with _recording(engine) as handled:
        run = engine.start(saga, {})
        deadline = time.monotonic() + 30
        while True:
            with engine.db.engine.connect() as connection:
                now = connection.execute(
                    select(executions.c.state).where(executions.c.id == run.id)
                ).scalar_one()
            if now == state:
                break
            assert time.monotonic() < deadline, f"run is {now}, not {state}"
            time.sleep(0.02)
        time.sleep(0.2)  # the last handler returns after the write the loop saw
    return handled


@pytest.fixture
def pg_engine() -> Iterator[SagaEngine]:
    with in_process_pg_engine("count") as engine:
        yield engine


def test_forward_step_node_takes_two_statements_and_one_synchronous_commit(
    pg_engine: SagaEngine,
) -> None:
    saga = Saga(f"fwd{uuid.uuid4().hex[:6]}")
    for index in range(3):
        saga.step(f"s{index}", _noop)
    pg_engine.register(saga)
    nodes = [h for h in _run_to(pg_engine, saga.name, "completed") if h.kind == "node"]
    assert len(nodes) == 3
    for node in nodes:
        assert len(node.statements) <= 2, node.statements
        assert node.synchronous_commits() <= 1, node.statements


def _unwound(engine: SagaEngine) -> list[Handled]:
    """Three compensated steps, then one that fails: three reversals."""
    saga = Saga(f"rev{uuid.uuid4().hex[:6]}")
    for index in range(3):
        saga.step(f"s{index}", _noop, compensate=_noop)
    saga.step("fails", _boom, retry=1)
    engine.register(saga)
    return _run_to(engine, saga.name, "failed")


def test_a_reversal_costs_no_more_than_a_forward_step(pg_engine: SagaEngine) -> None:
    handled = _unwound(pg_engine)
    reversals = [h for h in handled if h.kind == "reversal"]
    assert len(reversals) == 3  # the last one closes the run in its outcome statement
    for reversal in reversals:
        assert len(reversal.statements) <= 2, reversal.statements
        assert reversal.synchronous_commits() <= 1, reversal.statements
        updates_of_run_alone = [
            s
            for s in reversal.statements
            if s.lstrip().upper().startswith("UPDATE SAGA_EXECUTIONS") and "saga_steps" not in s
        ]
        assert not updates_of_run_alone, updates_of_run_alone
        # a compensation that takes nothing is not given the run: its claim reads no run row
        assert "JOIN" not in reversal.statements[0].upper(), reversal.statements[0]


def test_a_failing_step_begins_the_unwind_in_one_write_after_one_read(
    pg_engine: SagaEngine,
) -> None:
    saga = Saga(f"fail{uuid.uuid4().hex[:6]}")
    saga.step("s0", _noop, compensate=_noop)
    saga.step("fails", _boom, retry=1)
    pg_engine.register(saga)
    handled = _run_to(pg_engine, saga.name, "failed")
    failing = [h for h in handled if h.kind == "node"][-1]
    # the claim; one read of the run with its steps; one write that settles the step,
    # fails the run and carries the unwind's first move
    assert len(failing.statements) <= 3, failing.statements
    reads = [s for s in failing.statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1 and "saga_steps" in reads[0], failing.statements
    assert failing.synchronous_commits() <= 1, failing.statements


@pytest.fixture
def sqlite_engine(tmp_path: Any) -> Iterator[SagaEngine]:
    """The embedded default: a SQLite store and the in-process worker."""
    from celery import Celery

    from celery_saga.worker.embedded import embedded_worker

    app = Celery(f"count-{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
    app.conf.task_default_queue = app.main
    engine = SagaEngine(app, store_url=f"sqlite:///{tmp_path}/count.sqlite3")
    engine.ensure_schema()
    with embedded_worker(app):
        yield engine
    engine.db.dispose()


def test_on_sqlite_a_reversal_claims_first_then_reads_only_what_it_claimed(
    sqlite_engine: SagaEngine,
) -> None:
    """SQLite's reversal claim is PostgreSQL's guarded write, then, in its transaction, the
    read of the records the next move needs: no read of the run before the claim, and one
    statement more than a forward step (whose claim needs no read)."""
    handled = _unwound(sqlite_engine)
    steps = [h for h in handled if h.kind == "node"][:3]
    reversals = [h for h in handled if h.kind == "reversal"]
    assert len(steps) == 3 and len(reversals) == 3
    most = max(len(step.statements) for step in steps)
    for reversal in reversals:
        claim, read = (" ".join(s.split()) for s in reversal.statements[:2])
        assert claim.startswith("UPDATE saga_steps SET compensation_attempts"), claim
        assert read.startswith("SELECT") and "saga_executions" not in read, read
        assert len(reversal.statements) <= most + 1, (reversal.statements, most)
