"""Branch choices are journaled (guarantee 12); map results; schemas use the returned value
(guarantee 21); an unknown path fails the run clearly (guarantee 24)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from sqlalchemy import select

from celery_saga import ExecutionState, RollbackStatus, Saga, path, step
from celery_saga.store.tables import decisions
from tests.conftest import Harness


def _journal(harness: Harness, execution_id: str) -> dict[str, Any]:
    from celery_saga.store.codec import unpack

    with harness.engine.db.transaction() as connection:
        rows = connection.execute(
            select(decisions.c.key, decisions.c.value).where(
                decisions.c.execution_id == execution_id
            )
        )
        return {key: unpack(value) for key, value in rows}


@pytest.mark.parametrize(
    ("amounts", "path_steps"), [([50, 70], ["review", "approve"]), ([5], ["auto"])]
)
def test_branch_runs_the_chosen_path_and_journals_the_choice(
    harness: Harness, amounts: list[int], path_steps: list[str]
) -> None:
    run = harness.start("routed", {"amounts": amounts})
    execution = run.wait(30)
    assert execution.state is ExecutionState.COMPLETED, harness.worker_logs()
    assert [r.name for r in execution.steps] == ["total", *path_steps, "done"]
    assert execution.results["total"] == sum(amounts)
    assert _journal(harness, run.id) == {"branch:1": "big" if sum(amounts) > 100 else "small"}


def test_failure_inside_a_path_unwinds_that_path(harness: Harness) -> None:
    run = harness.start("routed", {"amounts": [200], "plan": {"done": {"fail": True}}})
    execution = run.wait(30)
    assert execution.rollback_status is RollbackStatus.COMPLETED, harness.worker_logs()
    undone = [e.step for e in harness.test_app.entries(run.id) if e.direction == "compensate"]
    assert undone == ["review"]


def test_selector_naming_an_unknown_path_fails_the_run_clearly(harness: Harness) -> None:
    execution = harness.start("misrouted").wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.failure_reason == (
        "BranchPathError: saga 'misrouted', branch 'size': selector returned 'huge'; "
        "defined paths are ['small']"
    )
    assert execution.steps == ()


def test_selector_that_raises_fails_the_run_with_its_error(sqlite_harness: Harness) -> None:
    def choose(ctx: Any) -> str:
        raise LookupError("no route for region 'mars'")

    fwd = sqlite_harness.test_app.forward
    sqlite_harness.engine.register(
        Saga("crashing_selector").step("a", fwd).branch("route", choose, path("p", step("b", fwd)))
    )
    execution = sqlite_harness.start("crashing_selector").wait(30)
    assert execution.state is ExecutionState.FAILED
    assert execution.failure_reason == (
        "BranchPathError: saga 'crashing_selector', branch 'route': selector raised "
        "LookupError: no route for region 'mars'"
    )


class Order(pydantic.BaseModel):
    order_id: int
    currency: str = "EUR"


class Receipt(pydantic.BaseModel):
    total: float
    note: str = "thanks"


def test_schemas_pass_on_the_value_the_validator_returns(sqlite_harness: Harness) -> None:
    seen: dict[str, Any] = {}

    def charge(ctx: Any) -> dict[str, Any]:
        seen["input"] = ctx.input
        return {"total": "12.5"}

    sqlite_harness.engine.register(
        Saga("typed").step("charge", charge, input_schema=Order, output_schema=Receipt)
    )
    execution = sqlite_harness.start("typed", {"order_id": "7"}).wait(30)
    assert execution.state is ExecutionState.COMPLETED
    assert seen["input"] == Order(order_id=7, currency="EUR")
    assert execution.results["charge"] == {"total": 12.5, "note": "thanks"}


def test_input_rejected_by_its_schema_fails_the_step_with_a_clear_reason(
    sqlite_harness: Harness,
) -> None:
    sqlite_harness.engine.register(Saga("strict").step("charge", lambda: 1, input_schema=Order))
    execution = sqlite_harness.start("strict", {"order_id": "not a number"}).wait(30)
    assert execution.state is ExecutionState.FAILED
    assert (execution.failure_reason or "").startswith(
        "SchemaValidationError: input of step 'charge' of saga 'strict' was rejected"
    )
