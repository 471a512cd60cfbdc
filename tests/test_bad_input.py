"""Guarantee 24: bad input to a public call gets a clear error and stores nothing."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from celery_saga import (
    DefinitionError,
    ExecutionNotFoundError,
    ExecutionState,
    PayloadError,
    Saga,
    SagaError,
    UnknownSagaError,
)
from celery_saga.store.tables import executions
from tests.conftest import Harness


def _stored(harness: Harness) -> int:
    with harness.engine.db.transaction() as connection:
        return int(connection.execute(select(func.count()).select_from(executions)).scalar_one())


@pytest.mark.parametrize(
    ("saga", "data", "error", "message"),
    [
        ("no_such_saga", {}, UnknownSagaError, "no saga named 'no_such_saga'"),
        ("five", {"when": {1, 2}}, PayloadError, "input of saga 'five'.*'set'"),
        ("five", {"blob": b"x" * (2 * 1024 * 1024)}, PayloadError, "limit is"),
        ("five", {"n": 2**70}, PayloadError, "outside the 64-bit range"),
    ],
)
def test_start_with_bad_input_is_refused_and_stores_nothing(
    harness: Harness, saga: str, data: Any, error: type[Exception], message: str
) -> None:
    before = _stored(harness)
    with pytest.raises(error, match=message):
        harness.engine.start(saga, data)
    assert _stored(harness) == before


def test_duplicate_or_malformed_execution_id_is_refused(harness: Harness) -> None:
    chosen = f"order-{uuid.uuid4().hex}"
    first = harness.engine.start("five", {"order": 20}, execution_id=chosen)
    before = _stored(harness)
    with pytest.raises(SagaError, match="already exists"):
        harness.engine.start("five", {"order": 21}, execution_id=chosen)
    for bad in ("", "x" * 65, 42, "order:1"):
        with pytest.raises(SagaError, match="execution_id must be"):
            harness.engine.start("five", {}, execution_id=bad)  # type: ignore[arg-type]
    assert _stored(harness) == before
    assert first.wait(30).record.input == {"order": 20}


def test_unknown_execution_ids_are_reported(harness: Harness) -> None:
    for call in (
        harness.engine.get,
        harness.engine.resume_compensation,
        harness.engine.abandon_compensation,
    ):
        with pytest.raises(ExecutionNotFoundError, match="no saga execution with id 'nope'"):
            call("nope")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit": 0}, "limit must be"),
        ({"limit": 5000}, "limit must be"),
        ({"state": "exploded"}, "unknown state"),
        ({"rollback_status": "maybe"}, "unknown rollback status"),
        ({"cursor": "not-a-cursor"}, "not a cursor"),
    ],
)
def test_list_with_bad_arguments_is_refused(
    harness: Harness, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(SagaError, match=message):
        harness.engine.list(**options)


def test_a_result_that_cannot_be_stored_fails_the_step_clearly(harness: Harness) -> None:
    if not harness.in_process:
        pytest.skip("registers a saga in-process")
    harness.engine.register(Saga("bad_result").step("a", lambda: {1, 2}))
    execution = harness.start("bad_result").wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.failure_reason is not None
    assert execution.failure_reason.startswith("PayloadError: result of step 'a' of saga")
    assert execution.step("a").attempts == 1


@pytest.mark.parametrize("data", [["order", 1], "order-1", 42])
def test_input_that_is_not_a_mapping_is_refused(harness: Harness, data: Any) -> None:
    before = _stored(harness)
    with pytest.raises(SagaError, match="input of saga 'five' must be a mapping"):
        harness.engine.start("five", data)
    assert _stored(harness) == before


def test_register_names_what_it_was_given_instead_of_a_saga(harness: Harness) -> None:
    with pytest.raises(DefinitionError, match="register\\(\\) takes Saga builders, got 'five'"):
        harness.engine.register("five")  # type: ignore[arg-type]


def test_a_lambda_step_needs_a_name() -> None:
    with pytest.raises(DefinitionError, match="pass one explicitly"):
        Saga("anonymous").step(lambda: None)


def test_an_unhashable_callable_step_runs(sqlite_harness: Harness) -> None:
    @dataclasses.dataclass
    class Charge:  # a callable dataclass instance is not hashable
        amount: int

        def __call__(self) -> int:
            return self.amount

    sqlite_harness.engine.register(Saga("unhashable").step("charge", Charge(5)))
    execution = sqlite_harness.start("unhashable").wait(30)
    assert execution.state is ExecutionState.COMPLETED
    assert execution.results == {"charge": 5}
