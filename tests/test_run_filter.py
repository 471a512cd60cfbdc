"""Which runs an operator means: ``--where`` terms, refused with the term named when they
cannot be read; run labels, refused with the label named when they cannot be stored; and
the one query builder that pages through what a filter selects (keyset, never OFFSET)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select, update

from celery_saga import ExecutionState, Saga, SagaEngine, SagaError, compensated_by, get_clock
from celery_saga.run_filter import FilterError, parse_where
from celery_saga.store import labels as run_labels
from celery_saga.store import run_selection
from celery_saga.store.tables import executions, step_records
from celery_saga.store.tables import run_labels as labels_table
from tests.conftest import _test_database_url, require_services, unconsumed_app

PG_PORT = 5432


@pytest.mark.parametrize(
    ("term", "named"),
    [
        ("customer", "expected KEY=VALUE"),
        ("colour=blue", "unknown key 'colour'"),
        ("state=stuck", "unknown state 'stuck'"),
        ("older=yesterday", "is not a duration"),
        ("error=timeout", "use error~TEXT"),
        ("saga~ord", "use error~TEXT"),
        ("saga=", "the value is empty"),
        ("label.cust omer=1", "the label key 'cust omer'"),
        ("label.=1", "the label key ''"),
        ("label.customer=" + "x" * 201, "the value of label 'customer'"),
        ("step=" + "s" * 201, "holds at most 200"),
    ],
)
def test_a_term_that_cannot_be_read_is_refused_naming_it(term: str, named: str) -> None:
    with pytest.raises(FilterError) as refused:
        parse_where([term])
    assert named in str(refused.value)
    assert repr(term)[:40] in str(refused.value) or term[:20] in str(refused.value)


def test_terms_given_twice_that_cannot_both_hold_are_refused() -> None:
    with pytest.raises(FilterError, match="label 'customer' is given twice"):
        parse_where(["label.customer=1", "label.customer=2"])
    with pytest.raises(FilterError, match="give older= once"):
        parse_where(["older=1h", "older=2h"])


def test_terms_read_into_one_filter() -> None:
    parsed = parse_where(
        [
            *("saga=order", "saga=refund", "state=waiting", "older=90m", "label.customer=42"),
            *("error~card declined", "step=charge", "version=abc123"),
        ]
    )
    assert parsed.sagas == ("order", "refund")
    assert parsed.states == (ExecutionState.WAITING,)
    assert parsed.older_than == timedelta(minutes=90)
    assert parsed.labels == (("customer", "42"),)
    assert parsed.errors == ("card declined",)
    assert parsed.steps == ("charge",)
    assert parsed.versions == ("abc123",)
    assert parse_where(parsed.terms) == parsed


# -- labels at start -------------------------------------------------------------------
def _gate_saga() -> Saga:
    def undo(ctx: Any) -> None:
        return None

    @compensated_by(undo)
    def reserve(ctx: Any) -> str:
        return "ok"

    return Saga("labelled").step("reserve", reserve).wait_for("go")


@pytest.fixture
def quiet(own_store: str) -> Iterator[SagaEngine]:
    """An engine on a store of its own (each kind of database) whose messages no worker
    takes: runs stay where they start."""
    engine = SagaEngine(unconsumed_app("labels"), store_url=own_store)
    engine.register(_gate_saga(), Saga("other").wait_for("go"))
    engine.ensure_schema()
    yield engine
    engine.db.dispose()


def _runs(engine: SagaEngine) -> int:
    return int(engine.db.read(select(func.count().label("n")).select_from(executions))[0]["n"])


@pytest.mark.parametrize(
    ("labels", "named"),
    [
        (["customer"], "labels must be a mapping"),
        ({"customer": 42}, "the value of label 'customer' is of type int"),
        ({"cust omer": "42"}, "the label key 'cust omer'"),
        ({"k" * 101: "1"}, "holds at most 100"),
        ({"customer": "x" * 201}, "the value of label 'customer' is 201 characters"),
        ({f"k{i}": "v" for i in range(21)}, "at most 20 labels"),
        ({"customer": "a\x00b"}, "NUL"),
    ],
)
def test_labels_that_cannot_be_stored_are_refused_naming_the_label_and_nothing_is_stored(
    quiet: SagaEngine, labels: Any, named: str
) -> None:
    before = _runs(quiet)
    with pytest.raises(SagaError, match="label") as refused:
        quiet.start("labelled", {}, labels=labels)
    assert named in str(refused.value)
    assert _runs(quiet) == before


def test_labels_are_stored_with_the_run_and_a_run_without_labels_has_none(
    quiet: SagaEngine,
) -> None:
    labelled = quiet.start("labelled", {}, labels={"customer": "42", "region": "eu"}).id
    plain = quiet.start("labelled", {}).id
    found = run_labels.load(quiet.db, [labelled, plain])
    assert found == {labelled: {"customer": "42", "region": "eu"}}


# -- the query builder ----------------------------------------------------------------
def _select_all(engine: SagaEngine, terms: list[str], page: int = 3) -> list[str]:
    """Every run ``terms`` select, page by page, checking no page repeats a run."""
    run_filter, after, seen = parse_where(terms), None, []
    now = get_clock().now()
    while True:
        got = run_selection.select_page(engine.db, run_filter, now=now, after=after, limit=page)
        seen += got.ids
        if got.cursor is None:
            break
        after = got.cursor
    assert len(seen) == len(set(seen))
    return seen


def test_pages_of_a_filter_hold_every_selected_run_once(quiet: SagaEngine) -> None:
    customers = {}
    for index in range(14):
        run = quiet.start("labelled", {}, labels={"customer": str(index % 3)}).id
        customers[run] = str(index % 3)
    others = {quiet.start("other", {}, labels={"customer": "0"}).id for _ in range(3)}
    zero = {run for run, customer in customers.items() if customer == "0"}
    assert set(_select_all(quiet, ["label.customer=0"])) == zero | others
    assert set(_select_all(quiet, ["label.customer=0", "saga=labelled"])) == zero
    assert set(_select_all(quiet, ["saga=other"])) == others
    assert set(_select_all(quiet, ["saga=labelled"], page=4)) == set(customers)
    assert _select_all(quiet, ["saga=labelled", "older=1h"]) == []
    assert _select_all(quiet, ["label.customer=9"]) == []
    count = run_selection.count(quiet.db, parse_where(["label.customer=0"]), now=get_clock().now())
    assert count == len(zero | others)


def test_state_step_and_error_terms_select_on_what_the_run_stands_at(quiet: SagaEngine) -> None:
    runs = [quiet.start("labelled", {}).id for _ in range(3)]
    # The first run's step failed with an error; the others never started it.
    with quiet.db.transaction() as connection:
        connection.execute(
            update(executions)
            .where(executions.c.id == runs[0])
            .values(state="failed", failure_reason="Card Declined by the provider")
        )
    assert _select_all(quiet, ["error~card declined"]) == [runs[0]]
    assert _select_all(quiet, ["state=failed"]) == [runs[0]]
    assert set(_select_all(quiet, ["state=running", "saga=labelled"])) == set(runs[1:])
    assert _select_all(quiet, ["error~50%"]) == []  # a LIKE wildcard is text here


def test_a_step_term_selects_runs_whose_current_or_failed_step_it_is(quiet: SagaEngine) -> None:
    failed, running, done = (quiet.start("labelled", {}).id for _ in range(3))
    now = get_clock().now().replace(tzinfo=None)
    for run, status in ((failed, "failed"), (running, "running"), (done, "completed")):
        with quiet.db.transaction() as connection:
            connection.execute(
                insert(step_records).values(
                    execution_id=run,
                    name="reserve",
                    node=0,
                    sub=0,
                    status=status,
                    attempts=1,
                    idempotency_key=f"{run}:reserve",
                    compensatable=True,
                    started_at=now,
                    compensation_attempts=0,
                    error="TimeoutError: read timed out" if status == "failed" else None,
                )
            )
    assert set(_select_all(quiet, ["step=reserve"])) == {failed, running}
    assert _select_all(quiet, ["step=reserve", "error~timed out"]) == [failed]
    assert _select_all(quiet, ["step=charge"]) == []


# -- cost of a start -------------------------------------------------------------------
def test_a_start_with_labels_costs_one_insert_more_and_without_none(
    tmp_path: Path,
) -> None:
    require_services(PG_PORT)
    engine = SagaEngine(unconsumed_app("labelcost"), store_url=_test_database_url())
    name = f"cost{uuid.uuid4().hex[:6]}"
    engine.register(Saga(name).wait_for("go"))
    engine.ensure_schema()
    engine.start(name, {})  # shapes stored, statements prepared
    statements: list[str] = []

    def seen(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement.lstrip().split()[0].upper())

    event.listen(engine.db.engine, "before_cursor_execute", seen)
    try:
        engine.start(name, {})
        plain = list(statements)
        statements.clear()
        labelled = engine.start(name, {}, labels={"customer": "42", "region": "eu"}).id
        with_labels = list(statements)
    finally:
        event.remove(engine.db.engine, "before_cursor_execute", seen)
        rows = engine.db.read(select(labels_table).where(labels_table.c.execution_id == labelled))
        engine.db.dispose()
    # The run and its ``started`` row: one statement (a CTE), as before labels existed.
    assert plain == ["WITH"], plain
    assert with_labels == ["WITH", "INSERT"], with_labels
    assert len(rows) == 2


def test_a_version_term_takes_a_hash_its_first_characters_or_its_label(
    quiet: SagaEngine,
) -> None:
    def extra(ctx: Any) -> None:
        return None

    first = quiet.definition("labelled")
    old = quiet.start("labelled", {}).id
    quiet.register(
        Saga("labelled", version="v2").step("reserve", lambda ctx: "ok").step("more", extra)
    )
    new = quiet.start("labelled", {}).id
    assert _select_all(quiet, [f"version={first.hash}"]) == [old]
    assert _select_all(quiet, [f"version={first.hash[:10]}"]) == [old]
    assert _select_all(quiet, ["version=v2", "saga=labelled"]) == [new]
    assert _select_all(quiet, ["version=v3"]) == []
