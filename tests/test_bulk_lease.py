"""One process at a time carries out a bulk operation (guarantee 36): a resume while another
process still works on it is refused, naming that process, and changes nothing; a process
whose operation was taken over stops before its next move; an operation given up on an
error, or held by a process of this machine that is gone, is resumed at once; one held
by a process elsewhere that vanished, once its lease lapses.

On PostgreSQL, with an in-process worker: runs parked at a gate, cancelled in bulk."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from celery_saga import ExecutionState, SagaEngine, SagaError
from celery_saga.cli import saga
from celery_saga.decisions.bulk_lease import Holder, LeaseVerdict, may_take, parse_holder
from celery_saga.store.database import to_db_time
from celery_saga.store.tables import bulk_operations
from celery_saga.worker.bulk import BulkReport
from celery_saga.worker.bulk_lease import OperationTakenOver, this_process
from tests.conftest import in_process_pg_engine
from tests.test_bulk_moves import _gate_saga, _until, _waiting_batch, moved_rows

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)
HERE = Holder("web-1", 400, "a1b2c3d4.4026531836", "t0")


@pytest.mark.parametrize(
    ("stored", "until", "alive", "verdict"),
    [
        (None, None, None, LeaseVerdict.FREE),
        ("web-1:401:a1b2c3d4.4026531836:t1", NOW - timedelta(seconds=1), True, LeaseVerdict.LAPSED),
        ("web-1:401:a1b2c3d4.4026531836:t1", NOW + timedelta(seconds=9), False, LeaseVerdict.GONE),
        ("web-1:401:a1b2c3d4.4026531836:t1", NOW + timedelta(seconds=9), True, LeaseVerdict.HELD),
        # Another machine's (or container's) pid 401 is not this one's: its lease decides.
        ("web-2:401:a1b2c3d4.4026531836:t1", NOW + timedelta(seconds=9), False, LeaseVerdict.HELD),
        ("web-1:401:ffffffff.1:t1", NOW + timedelta(seconds=9), False, LeaseVerdict.HELD),
        ("web-1:401::t1", NOW + timedelta(seconds=9), False, LeaseVerdict.HELD),
        ("written by hand", NOW + timedelta(seconds=9), None, LeaseVerdict.HELD),
    ],
)
def test_who_may_take_an_operation(
    stored: str | None, until: datetime | None, alive: bool | None, verdict: LeaseVerdict
) -> None:
    assert may_take(stored, until, NOW, HERE, alive) is verdict


def test_a_holder_name_reads_back_and_a_process_with_no_process_table_is_never_gone() -> None:
    here = this_process()
    assert parse_holder(str(here)) == here and str(os.getpid()) in here.shown
    blind = Holder("web-1", 401, "", "t1")
    later = NOW + timedelta(seconds=9)
    assert may_take(str(blind), later, NOW, Holder("web-1", 400, "", "t0"), False) is (
        LeaseVerdict.HELD
    )


#: The gate saga the runs of these tests park at (registered once per engine).
GATE = f"lease{uuid.uuid4().hex[:6]}"


@pytest.fixture
def engine() -> Iterator[SagaEngine]:
    with in_process_pg_engine("bulklease", _gate_saga(GATE), concurrency=2) as made:
        yield made


def _parked(engine: SagaEngine, count: int) -> tuple[list[str], str]:
    batch = uuid.uuid4().hex[:10]
    runs = _waiting_batch(engine, GATE, count, batch, lambda i: "c")
    return runs["c"], f"label.batch={batch}"


def _operation(engine: SagaEngine, operation_id: str) -> Any:
    rows = engine.db.read(select(bulk_operations).where(bulk_operations.c.id == operation_id))
    return rows[0]


def _held_by(engine: SagaEngine, operation_id: str, holder: str, seconds: float) -> None:
    """Store ``holder`` as the operation's, its lease running ``seconds`` from now."""
    until = to_db_time(datetime.now(timezone.utc) + timedelta(seconds=seconds))
    with engine.db.transaction() as connection:
        connection.execute(
            update(bulk_operations)
            .where(bulk_operations.c.id == operation_id)
            .values(holder=holder, lease_until=until)
        )


class Carrier:
    """A bulk cancel carried out in a thread of its own, its operation's id as it starts."""

    def __init__(self, engine: SagaEngine, where: str, rate: float) -> None:
        self.reports: list[BulkReport] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(engine, where, rate))
        self.thread.start()
        _until(lambda: bool(self.reports), 10, "the operation stored")
        self.operation_id = str(self.reports[0].operation_id)

    def _run(self, engine: SagaEngine, where: str, rate: float) -> None:
        try:
            engine.bulk("cancel", [where], actor="ops", rate=rate, progress=self.reports.append)
        except BaseException as error:
            self.error = error

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_a_resume_while_another_process_carries_it_out_is_refused_and_changes_nothing(
    engine: SagaEngine,
) -> None:
    runs, where = _parked(engine, 6)
    carrier = Carrier(engine, where, rate=4.0)
    _until(lambda: any(moved_rows(engine, runs).values()), 10, "a first run moved")
    before = _operation(engine, carrier.operation_id)
    with pytest.raises(SagaError, match=rf"is being carried out by .* pid {os.getpid()}"):
        engine.bulk("cancel", resume=carrier.operation_id)
    shown = CliRunner().invoke(
        saga, ["cancel", "--resume", carrier.operation_id], obj=SimpleNamespace(app=engine.app)
    )
    assert shown.exit_code == 1, shown.output
    assert f"is being carried out by {socket.gethostname()} pid {os.getpid()}" in shown.output
    after = _operation(engine, carrier.operation_id)
    assert (after.holder, after.lease_until >= before.lease_until) == (before.holder, True)
    carrier.join()
    assert carrier.error is None and carrier.reports[-1].finished
    assert all(len(actors) == 1 for actors in moved_rows(engine, runs).values())
    finished = _operation(engine, carrier.operation_id)
    assert (finished.holder, finished.lease_until) == (None, None), "a finished one is let go"


def test_a_process_whose_operation_was_taken_over_stops_before_its_next_move(
    engine: SagaEngine,
) -> None:
    """As if it had stalled past its lease and another process had taken the operation."""
    runs, where = _parked(engine, 20)
    carrier = Carrier(engine, where, rate=4.0)
    _until(lambda: sum(map(bool, moved_rows(engine, runs).values())) >= 2, 10, "two moved")
    elsewhere = "web-9:77:ffffffff.1:t9"
    _held_by(engine, carrier.operation_id, elsewhere, 30)
    taken_over_with = sum(map(bool, moved_rows(engine, runs).values()))
    carrier.join()
    assert isinstance(carrier.error, OperationTakenOver), carrier.error
    moved = sum(map(bool, moved_rows(engine, runs).values()))
    # At most the moves of one renewal's interval (RENEW_AFTER, 1 s at 4 a second) after.
    assert taken_over_with <= moved <= taken_over_with + 5 < len(runs)
    row = _operation(engine, carrier.operation_id)
    assert row.holder == elsewhere and row.finished_at is None, "it wrote nothing more"


def test_an_operation_stopped_on_an_error_is_let_go_and_resumed_at_once(
    engine: SagaEngine,
) -> None:
    runs, where = _parked(engine, 4)

    def interrupted(report: BulkReport) -> None:
        raise KeyboardInterrupt  # Ctrl-C as the first page begins

    with pytest.raises(KeyboardInterrupt):
        engine.bulk("cancel", [where], actor="ops", progress=interrupted)
    row = engine.db.read(select(bulk_operations).order_by(bulk_operations.c.created_at.desc()))[0]
    assert (row["holder"], row["acted"]) == (None, 0)
    done = engine.bulk("cancel", resume=row["id"])
    assert (done.acted, done.finished) == (4, True)
    assert all(len(actors) == 1 for actors in moved_rows(engine, runs).values())


def test_an_operation_held_by_a_vanished_process_elsewhere_resumes_once_its_lease_lapses(
    engine: SagaEngine, caplog: pytest.LogCaptureFixture
) -> None:
    runs, where = _parked(engine, 3)

    def stopped(report: BulkReport) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.bulk("cancel", [where], actor="ops", progress=stopped)
    operation_id = engine.db.read(
        select(bulk_operations.c.id).order_by(bulk_operations.c.created_at.desc())
    )[0]["id"]
    vanished = "worker-host-7:4242:0badf00d.4026531836:t7"
    _held_by(engine, operation_id, vanished, 25)
    with pytest.raises(SagaError, match="carried out by worker-host-7 pid 4242"):
        engine.bulk("cancel", resume=operation_id)
    assert not any(moved_rows(engine, runs).values()), "a refused resume moves nothing"
    _held_by(engine, operation_id, vanished, -1)
    with caplog.at_level(logging.WARNING, logger="celery_saga"):
        done = engine.bulk("cancel", resume=operation_id)
    assert (done.acted, done.finished) == (3, True)
    assert any("taken over from worker-host-7 pid 4242" in r.message for r in caplog.records)
    _until(lambda: all(engine.get(run).state is ExecutionState.CANCELLED for run in runs), 30)
