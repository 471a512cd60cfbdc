"""Guarantee 24 on every store: what the public API is handed never surfaces as a driver or
interpreter error. Ids no stored run can have are not found, payloads that nest too deeply
or contain themselves are a ``PayloadError``, and nothing is stored in any of these cases."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from celery_saga import (
    ExecutionNotFoundError,
    ExecutionState,
    PayloadError,
    Saga,
    SagaEngine,
    SagaError,
    StepStatus,
)
from celery_saga.decisions.admission import NodeMessage
from celery_saga.store.tables import executions, signals


def _rows(engine: SagaEngine) -> tuple[int, int]:
    with engine.db.transaction() as connection:
        runs = connection.execute(select(func.count()).select_from(executions)).scalar_one()
        received = connection.execute(select(func.count()).select_from(signals)).scalar_one()
        return int(runs), int(received)


def _cyclic() -> dict[str, Any]:
    looped: dict[str, Any] = {"order": 1, "lines": []}
    looped["lines"].append(looped)
    return looped


def _deep(depth: int = 5000) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _gate(engine: SagaEngine) -> tuple[str, str]:
    """A saga with one step before a gate, and a run of it parked at the gate."""
    saga = f"gate{uuid.uuid4().hex[:6]}"
    engine.register(Saga(saga).step("a", lambda: 1).wait_for("go").step("b", lambda: 2))
    run = engine.start(saga)
    engine.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    engine.executor.run_node(NodeMessage(run.id, 1, 0, 0, 1), saga)
    assert engine.get(run.id).state is ExecutionState.WAITING
    return saga, run.id


BAD_IDS = [42, None, b"run-1", "run\x00one", "x" * 65, "\ud800", ["run-1"]]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_an_id_no_run_can_have_is_not_found_by_every_lookup(direct: SagaEngine, bad: Any) -> None:
    _, waiting = _gate(direct)
    before = _rows(direct)
    for call in (
        direct.get,
        lambda value: direct.signal(value, "go"),
        direct.resume_compensation,
        direct.abandon_compensation,
        lambda value: direct.handle(value).get(),
    ):
        with pytest.raises(ExecutionNotFoundError, match="no saga execution with id"):
            call(bad)
    assert _rows(direct) == before
    assert direct.get(waiting).state is ExecutionState.WAITING


def test_an_id_differing_only_in_case_or_trailing_spaces_names_no_run(
    direct: SagaEngine,
) -> None:
    saga, _ = _gate(direct)
    run = direct.start(saga, execution_id=f"order-{uuid.uuid4().hex[:8]}")
    before = _rows(direct)
    for other in (run.id.upper(), run.id + " "):
        for call in (direct.get, lambda value: direct.signal(value, "go")):
            with pytest.raises(ExecutionNotFoundError, match="no saga execution with id"):
                call(other)
    assert _rows(direct) == before


@pytest.mark.parametrize("bad", ["run\x00one", "\ud800", "x" * 65, "", "a:b", 7], ids=repr)
def test_start_with_an_id_no_column_can_store_is_refused_and_stores_nothing(
    direct: SagaEngine, bad: Any
) -> None:
    saga, _ = _gate(direct)
    before = _rows(direct)
    with pytest.raises(SagaError, match="execution_id must be a string of 1-64 characters"):
        direct.start(saga, execution_id=bad)
    assert _rows(direct) == before


@pytest.mark.parametrize(
    "options",
    [
        {"saga": "bad\x00name"},
        {"saga": ["ok", 42]},
        {"saga": 42},
        {"saga": "n" * 201},
        {"cursor": base64.urlsafe_b64encode(b"2024-01-01T00:00:00|run\x00one").decode()},
        {"cursor": 12},
    ],
    ids=repr,
)
def test_list_with_filters_no_run_can_match_is_refused_clearly(
    direct: SagaEngine, options: dict[str, Any]
) -> None:
    with pytest.raises(SagaError, match=r"saga name|not a cursor returned by list"):
        direct.list(**options)


@pytest.mark.parametrize("value", [_cyclic(), {"deep": _deep()}], ids=["cyclic", "deep"])
def test_input_that_contains_itself_or_nests_too_deeply_is_refused(
    direct: SagaEngine, value: Any
) -> None:
    saga, _ = _gate(direct)
    before = _rows(direct)
    with pytest.raises(PayloadError, match=f"input of saga '{saga}'.*(contains itself|levels)"):
        direct.start(saga, value)
    assert _rows(direct) == before


@pytest.mark.parametrize("value", [_cyclic(), _deep()], ids=["cyclic", "deep"])
def test_a_signal_payload_that_contains_itself_or_nests_too_deeply_is_refused(
    direct: SagaEngine, value: Any
) -> None:
    _, run_id = _gate(direct)
    before = (_rows(direct), direct.get(run_id).record.version)
    with pytest.raises(PayloadError, match=r"payload of signal 'go'.*(contains itself|levels)"):
        direct.signal(run_id, "go", value)
    assert (_rows(direct), direct.get(run_id).record.version) == before
    assert direct.signal(run_id, "go", {"fine": True}) is True, "the refusal left no trace"


@pytest.mark.parametrize("value", [_cyclic(), _deep()], ids=["cyclic", "deep"])
def test_a_step_result_that_contains_itself_fails_the_step_with_a_payload_error(
    direct: SagaEngine, value: Any
) -> None:
    saga = f"result{uuid.uuid4().hex[:6]}"
    direct.register(Saga(saga).step("a", lambda: value).step("b", lambda: 2))
    run = direct.start(saga)
    direct.executor.run_node(NodeMessage(run.id, 0, 0, 0, 1), saga)
    execution = direct.get(run.id)
    assert execution.step("a").status is StepStatus.FAILED
    assert execution.step("a").result is None
    assert (execution.failure_reason or "").startswith(
        f"PayloadError: result of step 'a' of saga {saga!r}"
    ), execution.failure_reason
    assert execution.state in (ExecutionState.FAILED, ExecutionState.COMPENSATING)
