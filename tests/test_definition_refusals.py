"""Guarantee 29: definitions that can only wedge or fork are refused before anything is
stored: sub-sagas that reach their own saga (at ``register()``), names longer than the store
column that keeps them (at definition), a sub-saga not registered when the run starts. And a
path or parallel group given anything but ``step(...)`` specs gets a ``DefinitionError``; so
does a ``version=`` label given to a second, different graph (at ``register()``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select

from celery_saga import (
    DefinitionError,
    ExecutionState,
    Saga,
    SagaEngine,
    UnknownSagaError,
    path,
    step,
)
from celery_saga.limits import EXECUTION_ID_LENGTH, NAME_LENGTH
from celery_saga.runtime.keys import idempotency_key
from celery_saga.store.tables import executions, signals, step_records
from celery_saga.worker.embedded import embedded_worker
from tests.conftest import unconsumed_app


def work() -> str:
    return "done"


def undo() -> None:
    return None


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[SagaEngine]:
    """An engine for register() checks: nothing here reaches its store."""
    built = SagaEngine(unconsumed_app("refusals"), store_url=f"sqlite:///{tmp_path}/r.sqlite3")
    yield built
    built.db.dispose()


def _parent(name: str, *children: str) -> Saga:
    saga = Saga(name).step(f"{name}_first", work)
    for child in children:
        saga.sub_saga(child)
    return saga


# -- recursive sub-sagas, at register() --------------------------------------------------


def test_a_saga_running_itself_as_a_sub_saga_is_refused_and_not_registered(
    engine: SagaEngine,
) -> None:
    with pytest.raises(DefinitionError, match=r"'c' runs itself through its sub-sagas \(c -> c\)"):
        engine.register(_parent("c", "c"))
    assert engine.catalog("c") is None


def test_a_cycle_closed_by_a_later_register_call_is_refused_there(engine: SagaEngine) -> None:
    engine.register(_parent("a", "b"))  # b unknown for now: fine until a run starts
    with pytest.raises(DefinitionError, match=r"'b' runs itself.*\(b -> a -> b\)"):
        engine.register(_parent("b", "a"))
    assert engine.catalog("b") is None
    assert engine.catalog("a") is not None, "what was registered before stays"


def test_a_longer_cycle_registered_in_one_call_registers_none_of_it(engine: SagaEngine) -> None:
    with pytest.raises(DefinitionError, match=r"\((a -> b -> c -> a|b -> c -> a -> b)\)"):
        engine.register(
            _parent("a", "b"), _parent("b", "c"), _parent("c", "a"), _parent("innocent")
        )
    assert engine.catalog.names() == []


def test_a_cycle_through_a_renamed_sub_saga_record_is_refused(engine: SagaEngine) -> None:
    engine.register(Saga("outer").step("o", work).sub_saga("inner", name="the_inner_run"))
    looped = Saga("inner").step("i", work).sub_saga("outer", name="back_out")
    with pytest.raises(DefinitionError, match=r"inner -> outer -> inner"):
        engine.register(looped)


def test_a_sub_saga_given_as_a_builder_is_refused_asking_for_its_name() -> None:
    child = Saga("child").step("c", work)
    with pytest.raises(DefinitionError, match=r"pass sub_saga\('child'\) and register both"):
        Saga("parent").sub_saga(child)  # type: ignore[arg-type]


def test_sub_sagas_shared_without_a_cycle_are_accepted(engine: SagaEngine) -> None:
    engine.register(_parent("leaf"), _parent("left", "leaf"), _parent("right", "leaf"))
    engine.register(_parent("top", "left", "right", "leaf"))
    assert engine.catalog("top") is not None


# -- one version label, one graph (guarantee 22), at register() ------------------------------


def test_two_graphs_under_one_version_label_are_refused_naming_both_hashes(
    engine: SagaEngine,
) -> None:
    (first,) = engine.register(Saga("order", version="2").step("reserve", work))
    changed = Saga("order", version="2").step("reserve", work).step("audit", work)
    changed_hash = Saga("order", version="2").step("reserve", work).step("audit", work).seal().hash
    with pytest.raises(DefinitionError) as refused:
        engine.register(changed)
    message = str(refused.value)
    assert first.hash in message and changed_hash in message, message
    assert "'2'" in message and "nothing was registered" in message, message
    assert engine.catalog.versions("order") == [first], "the registered version stays alone"
    assert "order.audit" not in engine.app.tasks, "no step task bound for the refused graph"


def test_two_graphs_under_one_label_in_one_register_call_register_none_of_them(
    engine: SagaEngine,
) -> None:
    with pytest.raises(DefinitionError, match=r"version label '7'"):
        engine.register(
            Saga("order", version="7").step("reserve", work),
            Saga("order", version="7").step("reserve", work, compensate=undo),
        )
    assert engine.catalog.names() == []


def test_the_same_graph_again_or_a_new_label_is_accepted(engine: SagaEngine) -> None:
    engine.register(Saga("order", version="2").step("reserve", work))
    engine.register(Saga("order", version="2").step("reserve", work))  # identical: a no-op
    engine.register(Saga("order", version="3").step("reserve", work).step("audit", work))
    engine.register(Saga("order").step("reserve", work).step("ship", work))  # no label
    assert [d.label for d in engine.catalog.versions("order")] == ["2", "3", None]


# -- a sub-saga unknown when the run starts -----------------------------------------------


def _runs_of(engine: SagaEngine, saga: str) -> int:
    with engine.db.transaction() as connection:
        query = select(func.count()).select_from(executions).where(executions.c.saga_name == saga)
        return int(connection.execute(query).scalar_one())


def test_starting_a_saga_whose_sub_saga_is_not_registered_is_refused_and_stores_nothing(
    direct: SagaEngine,
) -> None:
    parent, child = f"p{uuid.uuid4().hex[:6]}", f"c{uuid.uuid4().hex[:6]}"
    direct.register(_parent(parent, child))
    with pytest.raises(UnknownSagaError, match=f"its sub-saga '{child}' is not registered"):
        direct.start(parent, execution_id=f"{parent}-1")
    assert _runs_of(direct, parent) == 0
    direct.register(_parent(child))
    assert direct.start(parent, execution_id=f"{parent}-1").get().state is ExecutionState.RUNNING


def test_a_missing_sub_saga_of_a_sub_saga_is_refused_naming_the_way_to_it(
    direct: SagaEngine,
) -> None:
    top, middle, leaf = (f"{kind}{uuid.uuid4().hex[:6]}" for kind in ("t", "m", "l"))
    direct.register(_parent(top, middle), _parent(middle, leaf))
    with pytest.raises(UnknownSagaError, match=f"'{leaf}' \\(via {top} -> {middle} -> {leaf}\\)"):
        direct.start(top)
    assert _runs_of(direct, top) == _runs_of(direct, middle) == 0


# -- names longer than their columns -------------------------------------------------------


def test_the_limits_are_the_store_columns() -> None:
    assert executions.c.id.type.length == EXECUTION_ID_LENGTH
    assert executions.c.saga_name.type.length == NAME_LENGTH
    assert step_records.c.name.type.length == NAME_LENGTH
    assert signals.c.event.type.length == NAME_LENGTH
    # The longest record name still leaves room in the idempotency key column.
    longest = idempotency_key("x" * EXECUTION_ID_LENGTH, "s" * NAME_LENGTH, 10**9, "compensate")
    assert len(longest) <= step_records.c.idempotency_key.type.length


LONG = "n" * (NAME_LENGTH + 1)


@pytest.mark.parametrize(
    ("build", "column"),
    [
        (lambda: Saga(LONG), "saga_executions.saga_name"),
        (lambda: Saga("s").step(LONG, work), "saga_steps.name"),
        (lambda: Saga("s").map(LONG, lambda ctx: 1), "saga_steps.name"),
        (lambda: Saga("s").parallel("g", step("ok", work), step(LONG, work)), "saga_steps.name"),
        (
            lambda: Saga("s").branch("b", lambda ctx: "p", path("p", step(LONG, work))),
            "saga_steps.name",
        ),
        (lambda: Saga("s").sub_saga("child", name=LONG), "saga_steps.name"),
        (lambda: Saga("s").sub_saga(LONG), "saga_executions.saga_name"),
        (lambda: Saga("s").wait_for(LONG), "saga_signals.event"),
    ],
)
def test_a_name_longer_than_its_column_is_refused_naming_the_column(
    build: Any, column: str
) -> None:
    with pytest.raises(DefinitionError, match=f"201 characters long; {column} holds at most 200"):
        build()


@pytest.mark.parametrize(
    ("build", "length"),
    [
        # for_each allows 1000 items by default: its last record is '<name>:999'.
        (lambda: Saga("s").for_each(lambda ctx: [], step("e" * 197, work)), 201),
        (
            lambda: Saga("s").do_until(
                lambda ctx: True, [step("ok", work), step("e" * 198, work)], max_iterations=11
            ),
            201,  # iteration 10 of 11: "<198 characters>:10"
        ),
        (lambda: Saga("s").do_while(lambda ctx: False, step("e" * 199, work)), 202),
    ],
)
def test_a_loop_step_whose_last_iteration_would_not_fit_is_refused(build: Any, length: int) -> None:
    with pytest.raises(DefinitionError, match=f"up to {length} characters with max_iterations="):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: Saga("bad\x00name"),
        lambda: Saga("s").step("a\x00b", work),
        lambda: Saga("s").wait_for("go\x00"),
        lambda: Saga("s").step("\ud800", work),
    ],
)
def test_a_name_no_backend_can_store_is_refused(build: Any) -> None:
    with pytest.raises(DefinitionError, match=r"NUL character|not valid text"):
        build()


def test_names_exactly_at_their_limits_run_on_every_store(store_url: str) -> None:
    app = Celery(
        f"limits-{uuid.uuid4().hex[:6]}", broker="memory://localhost/", set_as_current=False
    )
    app.conf.update(broker_transport_options={"polling_interval": 0.01})
    app.conf.task_default_queue = app.main
    engine = SagaEngine(app, store_url=store_url)
    name = uuid.uuid4().hex + "s" * (NAME_LENGTH - 32)
    event = "e" * NAME_LENGTH
    engine.register(
        Saga(name)
        .step("a" * NAME_LENGTH, work, compensate=undo)
        .do_until(lambda ctx: ctx.iteration >= 10, step("b" * 198, work), max_iterations=10)
        .wait_for(event)
    )
    engine.ensure_schema()
    with embedded_worker(app, concurrency=1):
        run = engine.start(name, execution_id="i" * (EXECUTION_ID_LENGTH - 32) + uuid.uuid4().hex)
        assert run.wait(30).state is ExecutionState.WAITING
        assert engine.signal(run.id, event) is True
        execution = run.wait(30)
        for _ in range(100):
            if execution.state is ExecutionState.COMPLETED:
                break
            time.sleep(0.05)
            execution = run.get()
    assert execution.state is ExecutionState.COMPLETED, execution.failure_reason
    assert execution.step("b" * 198 + ":9").status.value == "completed"
    engine.db.dispose()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Saga("s").step("charge", work).step("Charge", work),
            r"step names 'charge' and 'Charge' differ only in case",
        ),
        (
            lambda: Saga("s").step("charge", work).parallel("g", step("charge ", work)),
            r"step names 'charge' and 'charge ' differ only in case or trailing spaces",
        ),
        (
            lambda: Saga("s").step("a", work).sub_saga("child", name="A"),
            r"step names 'a' and 'A' differ",
        ),
        (
            lambda: Saga("s").wait_for("go").step("a", work).wait_for("GO"),
            r"wait_for events 'go' and 'GO' differ only in case",
        ),
    ],
)
def test_names_mysql_would_take_for_one_another_are_refused(build: Any, message: str) -> None:
    # On MySQL/MariaDB they would share one unique key: the second step's claim would be
    # refused for ever, and one gate's signal would pass the other.
    with pytest.raises(DefinitionError, match=message):
        build().seal()


# -- paths and parallel groups hold steps ---------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: path("fast", work), r"path 'fast' got .*\(function\) \(wrap it: step"),
        (lambda: path("fast", step("a", work), "b"), r"path 'fast' got 'b' \(str\)"),
        (
            lambda: Saga("s").parallel("g", step("a", work), 42),
            r"saga 's': parallel group 'g' got 42 \(int\); it holds only step\(\.\.\.\) specs",
        ),
        (lambda: Saga("s").parallel("g", None), r"parallel group 'g' got None \(NoneType\)"),
        (
            lambda: Saga("s").branch("b", lambda ctx: "x", ("x", step("a", work))),
            r"branch 'b' got .*\(tuple\); it takes path\(name, step\(\.\.\.\), \.\.\.\) items",
        ),
    ],
)
def test_anything_but_a_step_in_a_path_or_parallel_group_is_a_definition_error(
    build: Any, message: str
) -> None:
    with pytest.raises(DefinitionError, match=message):
        build()
