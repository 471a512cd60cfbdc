"""The store's conditional writes, on every backend: a refused write changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from celery_saga.decisions.cursor import Advance
from celery_saga.records import Attempt, ExecutionState, RollbackStatus, StepStatus
from celery_saga.store import forward, queries
from celery_saga.store.database import Database
from tests.conftest import PORTS, _test_database_url, mariadb_url, require_services

NOW = datetime.now(timezone.utc)


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/conditions.sqlite3"
    elif request.param == "postgres":
        require_services(PORTS["postgres"])
        url = _test_database_url()
    else:
        require_services(3306)
        url = mariadb_url()
    database = Database(url)
    database.migrate()
    yield database
    database.dispose()


def _claimed_run(db: Database, compensatable: bool = True) -> str:
    """A run at its first position, where step ``a`` is claimed by attempt 1."""
    execution_id = f"cond-{uuid.uuid4().hex}"
    queries.create_execution(
        db,
        execution_id=execution_id,
        saga_name="s",
        definition_hash="h",
        input_blob=b"\x80",
        node=0,
        sub=0,
        state=ExecutionState.RUNNING,
        committed=False,
        now=NOW,
    )
    attempt = forward.claim_step(
        db,
        execution_id=execution_id,
        name="a",
        node=0,
        sub=0,
        definition_hash="h",
        idempotency_key="k",
        compensatable=compensatable,
        lease_expires_at=NOW + timedelta(seconds=60),
        now=NOW,
        existing=None,
    )
    assert attempt == 1
    return execution_id


def _complete_a(
    db: Database, execution_id: str, now: datetime = NOW, advance: Advance | None = None
) -> bool:
    """Record attempt 1 of step ``a`` (node 0) completed, moving to node 1 unless
    ``advance`` says otherwise."""
    return forward.record_step_completed(
        db,
        Attempt(execution_id, "a", 0, 0, 1),
        result_blob=b"\xc0",
        advance=advance or Advance(1, 0, False, False),
        now=now,
    )


def test_outcome_is_not_recorded_once_the_run_left_the_position(db: Database) -> None:
    execution_id = _claimed_run(db)
    assert (
        forward.fail_execution(
            db,
            execution_id=execution_id,
            reason="elsewhere",
            compensations={"a"},
            now=NOW + timedelta(seconds=120),  # past the claim's lease
        )
        is not None
    )
    recorded = _complete_a(db, execution_id)
    execution, steps = queries.load_snapshot(db, execution_id)
    assert recorded is False
    assert steps[0].status is StepStatus.RUNNING, "the step row must not change alone"
    assert execution is not None and execution.state is ExecutionState.COMPENSATING


def test_outcome_of_a_claim_taken_over_is_refused(db: Database) -> None:
    execution_id = _claimed_run(db)
    _, steps = queries.load_snapshot(db, execution_id)
    later = NOW + timedelta(seconds=120)  # the first claim's lease has expired
    assert (
        forward.claim_step(
            db,
            execution_id=execution_id,
            name="a",
            node=0,
            sub=0,
            definition_hash="h",
            idempotency_key="k",
            compensatable=True,
            lease_expires_at=later + timedelta(seconds=60),
            now=later,
            existing=steps[0],
        )
        == 2
    )
    assert not _complete_a(db, execution_id, now=later)
    execution, steps = queries.load_snapshot(db, execution_id)
    assert execution is not None and execution.cursor == 0
    assert (steps[0].status, steps[0].attempts) == (StepStatus.RUNNING, 2)


def _claim(db: Database, execution_id: str, name: str = "a", graph: str = "h") -> int | None:
    return forward.claim_step(
        db,
        execution_id=execution_id,
        name=name,
        node=0,
        sub=0,
        definition_hash=graph,
        idempotency_key=f"{execution_id}:{name}",
        compensatable=True,
        lease_expires_at=NOW,
        now=NOW,
        existing=None,
    )


def test_a_second_first_claim_is_refused(db: Database) -> None:
    assert _claim(db, _claimed_run(db)) is None


def test_a_claim_against_another_graph_is_refused(db: Database) -> None:
    assert _claim(db, _claimed_run(db), name="b", graph="other") is None


def test_a_run_is_not_failed_from_outside_while_a_step_holds_a_live_lease(db: Database) -> None:
    execution_id = _claimed_run(db)
    assert (
        forward.fail_execution(
            db,
            execution_id=execution_id,
            reason="definition changed",
            compensations={"a"},
            now=NOW,
        )
        is None
    )
    execution, _ = queries.load_snapshot(db, execution_id)
    assert execution is not None and execution.state is ExecutionState.RUNNING


def test_failing_from_outside_honours_a_pivot_passed_after_any_earlier_read(db: Database) -> None:
    execution_id = _claimed_run(db)
    assert _complete_a(db, execution_id, advance=Advance(2, 0, False, True))
    plan = forward.fail_execution(
        db,
        execution_id=execution_id,
        reason="definition changed",
        compensations={"a"},
        now=NOW,
    )
    assert plan is not None and plan.rollback_status is RollbackStatus.NOT_APPLICABLE
