"""Guarantee 32, the wide half: an item of a ``for_each`` and a member of a parallel group
cost the same statements and read the same number of rows whatever their index, on
PostgreSQL, counted statement by statement (``benchmarks/wide_runs.py`` times it)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import event, select, update

from celery_saga import ExecutionState, Saga, SagaEngine, StepStatus, step
from celery_saga.decisions.admission import NodeMessage
from celery_saga.store.tables import executions
from tests.conftest import in_process_pg_engine

WIDTH = 210


@dataclass
class Handled:
    """What one node message's handler ran: statements, and rows each one returned."""

    message: NodeMessage
    statements: list[str] = field(default_factory=list)
    rows: int = 0

    def shape(self) -> tuple[int, int]:
        return len(self.statements), self.rows


def _noop() -> None:
    return None


@contextmanager
def _recording(engine: SagaEngine) -> Iterator[list[Handled]]:
    """Attribute every statement, and the rows it returned, to the node message whose
    handler runs on its thread."""
    handled: list[Handled] = []
    current = threading.local()

    def after_execute(_conn: Any, cursor: Any, statement: str, *_rest: Any) -> None:
        target = getattr(current, "handled", None)
        if target is None or statement.lstrip().upper().startswith("BEGIN"):
            return
        target.statements.append(statement)
        if cursor.description is not None:  # it returned rows (a read, or RETURNING)
            target.rows += max(cursor.rowcount, 0)

    run_node = engine.executor.run_node

    def wrapped(message: NodeMessage, *args: Any, **kwargs: Any) -> Any:
        current.handled = Handled(message)
        handled.append(current.handled)
        try:
            return run_node(message, *args, **kwargs)
        finally:
            current.handled = None

    engine.executor.run_node = wrapped  # type: ignore[method-assign]
    event.listen(engine.db.engine, "after_cursor_execute", after_execute)
    try:
        yield handled
    finally:
        event.remove(engine.db.engine, "after_cursor_execute", after_execute)
        engine.executor.run_node = run_node  # type: ignore[method-assign]


def _run(engine: SagaEngine, saga: Saga) -> list[Handled]:
    engine.register(saga)
    with _recording(engine) as handled:
        run = engine.start(saga.name, {"order": 7})
        deadline = time.monotonic() + 120
        while True:
            with engine.db.engine.connect() as connection:
                state = connection.execute(
                    select(executions.c.state).where(executions.c.id == run.id)
                ).scalar_one()
            if state == "completed":
                break
            assert time.monotonic() < deadline, f"run is {state}"
            time.sleep(0.05)
        time.sleep(0.2)  # the last handler returns after the write the loop saw
    return handled


@pytest.fixture
def pg_engine() -> Iterator[SagaEngine]:
    with in_process_pg_engine("wide") as engine:
        yield engine


def _at(
    handled: list[Handled], node: int, which: Callable[[NodeMessage], int]
) -> dict[int, Handled]:
    return {which(h.message): h for h in handled if h.message.node == node}


def _takes_item(item: int, order: int) -> int:
    return item + order


@pytest.mark.parametrize(
    ("body", "most"),
    [(_noop, 4), (_takes_item, 5)],
    ids=["takes-nothing", "takes-item-and-input"],
)
def test_a_for_each_item_costs_the_same_statements_and_rows_at_any_index(
    pg_engine: SagaEngine, body: Callable[..., Any], most: int
) -> None:
    saga = Saga(f"each{uuid.uuid4().hex[:6]}").for_each(
        lambda _ctx: list(range(WIDTH)), step("item", body), max_iterations=WIDTH
    )
    items = _at(_run(pg_engine, saga), 0, lambda m: m.sub)
    assert len(items) == WIDTH  # the last item moves the run past the loop
    early, late = items[5], items[200]
    print(f"for_each item 5: {early.shape()}, item 200: {late.shape()} (statements, rows)")
    assert early.shape() == late.shape(), (early, late)
    # run + record, items, claim, (the run's input,) outcome
    assert len(late.statements) <= most, late.statements


def test_a_parallel_member_costs_the_same_statements_and_rows_at_any_index(
    pg_engine: SagaEngine,
) -> None:
    members = [step(f"m{index}", _noop) for index in range(WIDTH)]
    saga = Saga(f"group{uuid.uuid4().hex[:6]}").parallel("group", *members).step("after", _noop)
    handled = _run(pg_engine, saga)
    # The members settle in the order the worker took their messages.
    settled = [h for h in handled if h.message.node == 0]
    assert len(settled) == WIDTH
    early, late = settled[5], settled[WIDTH - 10]
    print(f"member 5: {early.shape()}, member {WIDTH - 10}: {late.shape()} (statements, rows)")
    assert early.shape() == late.shape(), (early, late)
    assert len(late.statements) <= 2, late.statements  # claim, settle and count


def test_a_group_joins_once_whether_or_not_its_run_kept_counts(direct: SagaEngine) -> None:
    # A run stored before the counts existed has NULL there, perhaps with members settled
    # already: its next member counts the group's records, and the next group counts afresh.
    name = f"legacy{uuid.uuid4().hex[:6]}"
    first = [step(f"a{index}", _noop) for index in range(3)]
    second = [step(f"b{index}", _noop) for index in range(2)]
    direct.register(Saga(name).parallel("first", *first).parallel("second", *second))
    run = direct.start(name)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), name)
    with direct.db.transaction() as connection:
        connection.execute(
            update(executions)
            .where(executions.c.id == run.id)
            .values(members_settled=None, members_failed=None)
        )
    for member in (1, 2):
        assert direct.get(run.id).record.cursor == 0
        direct.executor.run_node(NodeMessage(run.id, 0, 0, member, 1), name)
    assert direct.get(run.id).record.cursor == 1
    for member in (1, 1, 0):  # a duplicate delivery counts nothing twice
        direct.executor.run_node(NodeMessage(run.id, 1, 0, member, 1), name)
    execution = direct.get(run.id)
    assert execution.state is ExecutionState.COMPLETED
    assert [execution.step(f"b{index}").status for index in (0, 1)] == [StepStatus.COMPLETED] * 2


def test_a_group_whose_counts_missed_a_member_joins_when_a_settled_member_comes_again(
    direct: SagaEngine,
) -> None:
    # A worker of an earlier release settles a member without counting it: the last member
    # then finds the group short. The recovery sweep sends the members' messages again to a
    # run that stopped moving; a settled member's message counts the records and joins.
    name = f"missed{uuid.uuid4().hex[:6]}"
    members = [step(f"m{index}", _noop) for index in range(3)]
    direct.register(Saga(name).parallel("group", *members).step("after", _noop))
    run = direct.start(name)
    for member in (0, 1):
        direct.executor.run_node(NodeMessage(run.id, 0, 0, member, 1), name)
    with direct.db.transaction() as connection:
        connection.execute(
            update(executions)
            .where(executions.c.id == run.id)
            .values(members_settled=executions.c.members_settled - 1)
        )
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 2, 1), name)
    assert direct.get(run.id).record.cursor == 0, "the last member found the group short"
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), name)
    assert direct.get(run.id).record.cursor == 1
    direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), name)
    assert direct.get(run.id).state is ExecutionState.COMPLETED


def test_counts_an_earlier_release_left_behind_never_join_the_next_group_early(
    direct: SagaEngine,
) -> None:
    # A worker of an earlier release joins a group without resetting the counts, which it
    # does not know: the next group starts with counts of another. Its members must still
    # wait for each other: the member whose count reaches the size checks the records.
    name = f"stale{uuid.uuid4().hex[:6]}"
    members = [step(f"m{index}", _noop) for index in range(3)]
    direct.register(Saga(name).parallel("group", *members).step("after", _noop))
    run = direct.start(name)
    with direct.db.transaction() as connection:
        connection.execute(
            update(executions)
            .where(executions.c.id == run.id)
            .values(members_settled=2, members_failed=0)
        )
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), name)
    assert direct.get(run.id).record.cursor == 0, "one member of three settled: no join"
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 1, 1), name)
    assert direct.get(run.id).record.cursor == 0, "two of three: no join"
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 2, 1), name)
    assert direct.get(run.id).record.cursor == 1, "all three: the group joins, once"
    direct.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), name)
    assert direct.get(run.id).state is ExecutionState.COMPLETED
