"""A reversal's claim on PostgreSQL and SQLite reads the run only when the compensation
needs it (store/reversal.py): otherwise it returns two step records, and the unwind's next
move decided from them is the one decided from the whole run."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete
from sqlalchemy.exc import OperationalError

from celery_saga import RollbackStatus, Saga, SagaContext, SagaEngine, SagaError
from celery_saga.decisions.unwind import UnwindStep, next_after_outcome
from celery_saga.records import (
    Attempt,
    CompensationOutcome,
    ExecutionState,
    StepRecord,
)
from celery_saga.store import queries, reversal
from celery_saga.store.database import Database
from celery_saga.store.tables import executions, step_records
from tests.conftest import PORTS, _test_database_url, in_process_pg_engine
from tests.faults import CuttableProxy, proxy
from tests.test_store_conditions import NOW

LEASE = NOW + timedelta(seconds=60)
#: What the deployed definition can reverse; ``gone`` was removed from it.
COMPENSATIONS = frozenset({"a", "b", "c", "d", "e", "f", "child"})
STATUSES = (
    None,
    CompensationOutcome.COMPENSATED,
    CompensationOutcome.SKIPPED,
    CompensationOutcome.FAILED,
)


@pytest.fixture(params=["postgres", "sqlite"])
def db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    """The claim's own statements: PostgreSQL's one, SQLite's claim-then-read."""
    if request.param == "postgres":
        database = request.getfixturevalue("pg_db")
        yield database
        # Its runs are stale compensating runs of a saga no process has: left in the shared
        # test store, every later sweep there would read and log each of them.
        with database.transaction() as connection:
            connection.execute(delete(executions).where(executions.c.id.like("claim-%")))
        return
    database = Database(f"sqlite:///{tmp_path_factory.mktemp('claim')}/claim.sqlite3")
    database.migrate()
    yield database
    database.dispose()


@dataclass(frozen=True)
class Step:
    name: str
    compensatable: bool
    status: CompensationOutcome | None
    child: bool = False


def _store_run(db: Database, steps: list[Step]) -> str:
    """A compensating run whose steps are as given, in start order."""
    run = f"claim-{uuid.uuid4().hex}"
    queries.create_execution(
        db,
        execution_id=run,
        saga_name="s",
        definition_hash="h",
        input_blob=b"\x80",
        node=len(steps),
        sub=0,
        state=ExecutionState.COMPENSATING,
        committed=False,
        now=NOW,
    )
    rows = [
        {
            "execution_id": run,
            "name": step.name,
            "node": index,
            "sub": 0,
            "status": "completed",
            "attempts": 1,
            "idempotency_key": f"key-{step.name}",
            "compensatable": step.compensatable,
            "result": b"\xc0",
            "started_at": NOW,
            "completed_at": NOW,
            "compensation_status": None if step.status is None else step.status.value,
            "compensation_attempts": 0 if step.status is None else 1,
            "child_execution_id": f"{run}-child" if step.child else None,
        }
        for index, step in enumerate(steps)
    ]
    with db.transaction() as connection:
        for row in rows:  # one by one: ids in start order
            connection.execute(step_records.insert(), row)
    return run


def _claim(db: Database, run: str, name: str, with_run: bool) -> reversal.Unwinding | None:
    held = Attempt.reversal(run, name, 1)
    return reversal.claim_next_reversal(db, held, lease_expires_at=LEASE, with_run=with_run)


def _comparable(plan: UnwindStep) -> tuple[Any, ...]:
    record = plan.record
    name = None if record is None else record.name
    return plan.kind, name, plan.rollback_status


@st.composite
def unwinds(draw: Any) -> tuple[list[Step], str]:
    """A run's steps and the step whose reversal a message asks for: usually the one the
    unwind owes next, sometimes one that is not (a later step still owed one)."""
    names = draw(st.lists(st.sampled_from(sorted(COMPENSATIONS | {"gone"})), unique=True))
    names = [*names, "target"]
    steps = [
        Step(
            name,
            draw(st.booleans()),
            draw(st.sampled_from(STATUSES)),
            child=name == "child",
        )
        for name in names
    ]
    target = draw(st.integers(0, len(steps) - 1))
    steps[target] = Step(steps[target].name, True, None)
    if draw(st.integers(0, 4)):  # mostly: every step started after it is settled
        settled = (CompensationOutcome.COMPENSATED, CompensationOutcome.SKIPPED)
        for index in range(target + 1, len(steps)):
            if steps[index].compensatable:
                status = draw(st.sampled_from(settled))
                steps[index] = replace(steps[index], status=status)
    return steps, steps[target].name


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(unwinds())
def test_the_lean_claim_decides_the_next_move_as_the_whole_run_does(
    db: Database, unwind: tuple[list[Step], str]
) -> None:
    steps, name = unwind
    whole = _claim(db, _store_run(db, steps), name, with_run=True)
    lean = _claim(db, _store_run(db, steps), name, with_run=False)
    assert (whole is None) == (lean is None)
    if whole is None or lean is None:
        return
    assert lean.run is None and whole.run is not None
    assert len(lean.steps) <= 2 and lean.steps[-1].name == name
    mine: list[StepRecord] = [s for s in whole.steps if s.name == name]
    assert replace(lean.steps[-1], id=0, execution_id="") == replace(mine[0], id=0, execution_id="")
    for outcome in (CompensationOutcome.COMPENSATED, CompensationOutcome.FAILED):
        decided = [
            next_after_outcome(u.steps, u.committed, COMPENSATIONS, name, outcome, "r")
            for u in (whole, lean)
        ]
        assert _comparable(decided[0]) == _comparable(decided[1])


def test_the_lean_claim_returns_the_claimed_record_as_claimed(db: Database) -> None:
    run = _store_run(db, [Step("a", True, None), Step("x", False, None), Step("b", True, None)])
    lean = _claim(db, run, "b", with_run=False)
    assert lean is not None
    assert [s.name for s in lean.steps] == ["a", "b"]
    assert lean.steps[-1].compensation_attempts == 1
    assert lean.steps[-1].compensation_lease_expires_at == LEASE
    assert _claim(db, run, "b", with_run=False) is None  # claimed once


# -- through the engine: each compensation gets what it asks for ---------------------------

received: list[tuple[str, Any]] = []


def _charge() -> dict[str, int]:
    return {"charged": 7}


def _refund(result: dict[str, int]) -> None:
    received.append(("refund", result))


def _reserve() -> str:
    return "seat-3"


def _release(ctx: SagaContext) -> None:
    received.append(("release", (ctx.input, dict(ctx.results), ctx.forward_result)))


def _noop_step() -> None:
    return None


def _notify() -> None:
    received.append(("notify", None))


def _boom() -> None:
    raise RuntimeError("declined")


@pytest.fixture
def pg_engine() -> Iterator[SagaEngine]:
    with in_process_pg_engine("lean") as engine:
        yield engine


def test_each_compensation_gets_its_result_or_the_whole_context(pg_engine: SagaEngine) -> None:
    saga = Saga(f"lean{uuid.uuid4().hex[:6]}")
    saga.step("charge", _charge, compensate=_refund)
    saga.step("reserve", _reserve, compensate=_release)
    saga.step("notify", _noop_step, compensate=_notify)
    saga.step("fails", _boom, retry=1)
    pg_engine.register(saga)
    received.clear()
    run = pg_engine.start(saga.name, {"order": 1}).wait(timeout=30)
    assert run.state is ExecutionState.FAILED, run
    results = {"charge": {"charged": 7}, "reserve": "seat-3"}
    assert received == [
        ("notify", None),
        ("release", ({"order": 1}, {**results, "notify": None}, "seat-3")),
        ("refund", {"charged": 7}),
    ]


# -- the store cut at a lean claim ----------------------------------------------------------


def _cut_at_claim(cuttable: CuttableProxy, name: str, seconds: float, reply_lost: bool) -> Any:
    """``claim_next_reversal``, with the store cut (really, at the proxy) for ``seconds``
    once, as the reversal of ``name`` is claimed: before its statement, or, with
    ``reply_lost``, right after it committed (its reply then counts as lost)."""
    real, done = reversal.claim_next_reversal, []

    def claim(db: Database, held: Attempt, **fields: Any) -> reversal.Unwinding | None:
        if held.name != name or done:
            return real(db, held, **fields)
        done.append(True)
        if not reply_lost:
            cuttable.cut(seconds)
            return real(db, held, **fields)
        claimed = real(db, held, **fields)
        assert claimed is not None and claimed.run is None  # the lean claim landed
        cuttable.cut(seconds)
        raise OperationalError("WITH claimed AS ...", {}, Exception("connection lost"))

    return claim


@pytest.mark.parametrize(("seconds", "reply_lost"), [(1, False), (30, False), (1, True)])
def test_a_store_cut_at_a_lean_claim_runs_each_reversal_once(
    monkeypatch: pytest.MonkeyPatch, seconds: float, reply_lost: bool
) -> None:
    saga = Saga(f"cut{uuid.uuid4().hex[:6]}")
    saga.step("charge", _charge, compensate=_refund)
    saga.step("reserve", _reserve, compensate=_release)
    saga.step("fails", _boom, retry=1)
    received.clear()
    with proxy(PORTS["postgres"]) as cuttable:
        monkeypatch.setattr(
            reversal, "claim_next_reversal", _cut_at_claim(cuttable, "charge", seconds, reply_lost)
        )
        through = _test_database_url().replace(
            f"127.0.0.1:{PORTS['postgres']}", f"127.0.0.1:{cuttable.port}"
        )
        with in_process_pg_engine("cut", saga, store_url=through, saga_lease_seconds=3) as engine:
            run = engine.start(saga.name, {"order": 2})
            deadline = time.monotonic() + seconds + 60
            while (state := _state_or_none(engine, run.id)) is not ExecutionState.FAILED:
                assert time.monotonic() < deadline, state
                time.sleep(0.2)
            execution = engine.get(run.id)
    assert cuttable.cuts, "the store was cut"
    assert execution.rollback_status is RollbackStatus.COMPLETED
    assert [name for name, _ in received] == ["release", "refund"]  # each once
    assert received[-1] == ("refund", {"charged": 7})


def _state_or_none(engine: SagaEngine, run_id: str) -> ExecutionState | None:
    try:
        return engine.get(run_id).state
    except SagaError:  # the store is cut
        return None


def test_on_sqlite_only_the_lean_read_holds_the_write_lock(tmp_path: Any) -> None:
    """SQLite: the two records of a lean claim are read inside the claim's transaction (its
    write lock held); the whole run is read once the claim has committed, so a run of many
    steps does not hold every other writer while its rows are decoded."""
    from sqlalchemy import event

    db = Database(f"sqlite:///{tmp_path}/lock.sqlite3")
    db.migrate()
    seen: list[tuple[str, bool]] = []

    def on_execute(connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        locked = bool(connection.connection.dbapi_connection.in_transaction)
        seen.append((" ".join(statement.split())[:40], locked))

    event.listen(db.engine, "before_cursor_execute", on_execute)
    try:
        for with_run in (False, True):
            seen.clear()
            run = _store_run(db, [Step("a", True, None), Step("b", True, None)])
            assert _claim(db, run, "b", with_run=with_run) is not None
            claim, read = seen[-2:]
            assert claim[0].startswith("UPDATE saga_steps") and read[0].startswith("SELECT")
            assert read[1] is not with_run, seen
    finally:
        event.remove(db.engine, "before_cursor_execute", on_execute)
        db.dispose()
