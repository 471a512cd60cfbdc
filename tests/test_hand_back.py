"""A message a worker cannot run goes back at the pace its line says, in-process: the
embedded worker on ``memory://`` with SQLite stores (guarantee 22). Real workers on RabbitMQ
and Redis: tests/test_hand_back_pace.py.

A worker without a step's task or without the run's version holds the message for its step
of the backoff, logs one line for it, and sends it back; a worker whose store does not hold
the run (a worker of another deployment on the queue) hands it back too, instead of dropping
it, and ``wait()`` says which worker hands the message back and why.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from celery_saga import ExecutionState, RunNotSettledError, Saga, SagaEngine
from celery_saga.decisions import hand_back as hand_back_decisions
from celery_saga.decisions.hand_back import SPREAD, HandBackReason
from celery_saga.decisions.versions import hand_back_countdown
from celery_saga.worker import hand_back_pool
from celery_saga.worker import handle as handle_module
from celery_saga.worker.embedded import embedded_worker
from celery_saga.worker.hand_back_notes import Handed
from celery_saga.worker.hand_back_pool import Marks
from celery_saga.worker.saga_header import HEADER, VERSION
from tests.conftest import unconsumed_app


def _charge() -> str:
    return "charged"


def _charge_v2() -> str:
    return "charged twice over"


def _sagas(version: str) -> list[Saga]:
    """``rollout`` 2 adds a first step whose task version 1 lacks; ``bill`` 2 keeps its one
    task (``bill.charge``) with a new body."""
    rollout = Saga("rollout", version=version)
    if version == "2":
        rollout = rollout.step("vet", lambda: None)
    rollout = rollout.step("apply", lambda: None)
    bill = Saga("bill", version=version).step("charge", _charge if version == "1" else _charge_v2)
    return [rollout, bill]


def _engine(queue: str, store: str, *versions: str) -> SagaEngine:
    app = unconsumed_app(f"hand-back-{'-'.join(versions)}")
    app.conf.update(
        task_default_queue=queue,
        broker_transport_options={"polling_interval": 0.01},
        worker_hijack_root_logger=False,  # the test reads the lines (caplog)
    )
    engine = SagaEngine(app, store_url=store)
    for version in versions:
        engine.register(*_sagas(version))
    return engine


@pytest.fixture
def deploys(tmp_path: Path) -> Iterator[dict[str, SagaEngine]]:
    """Processes of one deployment (one store) by versions, and one of another store, all
    on one queue."""
    queue = unconsumed_app("hand-back").main
    store = f"sqlite:///{tmp_path}/store.sqlite3"
    engines = {
        "1": _engine(queue, store, "1"),
        "1,2": _engine(queue, store, "1", "2"),
        "2": _engine(queue, store, "2"),
        "other": _engine(queue, f"sqlite:///{tmp_path}/other.sqlite3", "1", "2"),
    }
    yield engines
    for engine in engines.values():
        engine.db.dispose()


def _worker(engine: SagaEngine, name: str) -> Any:
    return embedded_worker(
        engine.app, queues=[engine.app.conf.task_default_queue], hostname=f"{name}@localhost"
    )


_HANDED = re.compile(r"execution (\S+?):? .*; message (\S+) handed back \((\d+)\)")


def _hand_backs(caplog: pytest.LogCaptureFixture) -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for record in caplog.records:
        match = _HANDED.search(record.getMessage())
        if match and record.levelno == logging.WARNING:
            found.setdefault((match[1], match[2]), []).append(int(match[3]))
    return found


def _steps_within(seconds: float) -> int:
    """The most hand-backs of one message in ``seconds``: each pause at its shortest."""
    steps, spent = 1, 0.0
    while spent + hand_back_countdown(steps - 1) * (1 - SPREAD) <= seconds:
        spent += hand_back_countdown(steps - 1) * (1 - SPREAD)
        steps += 1
    return steps


def test_an_in_process_worker_hands_back_at_the_pace_it_logs_and_lets_go_when_it_stops(
    deploys: dict[str, SagaEngine], caplog: pytest.LogCaptureFixture
) -> None:
    newest = deploys["2"]
    runs = {newest.start("rollout").id: "rollout.vet", newest.start("bill").id: "bill.charge"}
    with caplog.at_level(logging.WARNING, logger="celery_saga"), _worker(deploys["1"], "old"):
        time.sleep(3.2)  # pauses of about 0.5, 1 and 2 s: three or four hand-backs
    handed = _hand_backs(caplog)
    assert set(handed) == set(runs.items()), handed.keys()
    for key, counts in handed.items():
        assert counts == list(range(1, len(counts) + 1)), (key, counts[:12])
        assert 2 <= len(counts) <= _steps_within(3.2), (key, len(counts))
    for execution_id in runs:
        run = newest.get(execution_id)
        assert run.waiting_for_version == run.record.definition_hash and not run.steps

    with _worker(deploys["1,2"], "new"):  # what the stopped worker held is offered again
        for execution_id in runs:
            ended = newest.handle(execution_id).wait(timeout=10)
            assert ended.state is ExecutionState.COMPLETED
            assert ended.waiting_for_version is None


def test_a_run_of_another_store_is_handed_back_not_dropped_and_wait_says_why(
    deploys: dict[str, SagaEngine],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handle_module, "QUIET_SECONDS", 1.5)
    mine, other = deploys["1,2"], deploys["other"]
    run = mine.start("bill")
    with caplog.at_level(logging.INFO, logger="celery_saga"), _worker(other, "other"):
        with pytest.raises(RunNotSettledError) as raised:
            run.wait(timeout=3)
        time.sleep(0.5)
    lines = [r.getMessage() for r in caplog.records if run.id in r.getMessage()]
    refused = [line for line in lines if "refused" in line]
    assert not refused, f"the message is handed back, never dropped: {refused}"
    counts = Counter("not in this worker's saga store" in line for line in lines)
    assert counts[True] >= 2, lines
    message = str(raised.value)
    assert "at step 'charge', whose task 'bill.charge' no worker has taken" in message, message
    assert "other@localhost consumes queue" in message, message
    assert f"another saga store ({other.hand_backs.shown_store})" in message, message
    assert "a worker of another deployment shares the queue" in message, message

    with _worker(mine, "mine"):
        assert run.wait(timeout=10).state is ExecutionState.COMPLETED
    assert run.get().results == {"charge": "charged twice over"}


def test_wait_names_the_worker_that_lacks_the_runs_version(
    deploys: dict[str, SagaEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handle_module, "QUIET_SECONDS", 0.3)
    newest = deploys["2"]
    bill, rollout = newest.start("bill"), newest.start("rollout")
    with _worker(deploys["1"], "old"):
        with pytest.raises(RunNotSettledError) as raised:
            bill.wait(timeout=2)
        version = bill.get().record.definition_hash
        assert f"waiting for a worker with version {version} of saga 'bill'" in str(raised.value)
        assert f"old@localhost does not have version {version} of saga 'bill'" in str(raised.value)
        with pytest.raises(RunNotSettledError) as raised:
            rollout.wait(timeout=2)
        assert "old@localhost does not have task 'rollout.vet'" in str(raised.value)
        assert "engine.autodiscover_sagas()" in str(raised.value)


def test_a_stale_message_of_this_store_is_still_dropped(
    deploys: dict[str, SagaEngine], caplog: pytest.LogCaptureFixture
) -> None:
    """A message of a run its own store no longer holds is not handed back for ever."""
    mine = deploys["1,2"]
    with _worker(mine, "mine"):
        run = mine.start("bill").wait(timeout=10)
        assert run.state is ExecutionState.COMPLETED
    with mine.db.engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM saga_steps")
        connection.exec_driver_sql("DELETE FROM saga_executions")
    mine.publisher.publish_node("bill", mine.definition("bill").nodes[0].step, _first(run.id))
    with caplog.at_level(logging.INFO, logger="celery_saga"), _worker(mine, "mine"):
        time.sleep(1.0)
    lines = [r.getMessage() for r in caplog.records if run.id in r.getMessage()]
    assert any("refused: missing" in line for line in lines), lines
    assert not any("handed back" in line for line in lines), lines


def _first(execution_id: str) -> Any:
    from celery_saga.decisions.admission import NodeMessage

    return NodeMessage(execution_id, 0, 0, 0, 1)


def test_a_stale_message_under_another_spelling_of_the_store_is_dropped_after_its_bound(
    deploys: dict[str, SagaEngine],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A worker reaching its store under another URL (a host alias, PgBouncer) names it
    otherwise: a message of a deleted run is handed back as another store's, until it has
    been handed back ``ABSENT_HAND_BACKS`` times (2 here); then it is dropped, at INFO."""
    monkeypatch.setattr(hand_back_decisions, "ABSENT_HAND_BACKS", 2)
    mine = deploys["1,2"]
    queue = mine.app.conf.task_default_queue
    alias = _engine(queue, f"sqlite:///{tmp_path}/./store.sqlite3", "1", "2")
    assert alias.hand_backs.store != mine.hand_backs.store, "one file, two spellings"
    with _worker(mine, "mine"):
        run = mine.start("bill").wait(timeout=10)
    with mine.db.engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM saga_steps")
        connection.exec_driver_sql("DELETE FROM saga_executions")
    mine.publisher.publish_node("bill", mine.definition("bill").nodes[0].step, _first(run.id))
    try:
        with caplog.at_level(logging.INFO, logger="celery_saga"), _worker(alias, "alias"):
            time.sleep(3.0)  # pauses of about 0.5 and 1 s, then the drop
    finally:
        alias.db.dispose()
    lines = [r.getMessage() for r in caplog.records if run.id in r.getMessage()]
    dropped = [r for r in caplog.records if run.id in r.getMessage() and "dropped" in r.message]
    assert len(dropped) == 1 and dropped[0].levelno == logging.INFO, lines
    assert "handed back 2 times" in dropped[0].getMessage(), lines
    assert not any("handed back (3)" in line for line in lines), lines


def test_the_consumer_decides_without_importing_any_module(
    deploys: dict[str, SagaEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's loop looks a version up among those registered, never by discovery
    (module imports) on a miss."""
    engine = deploys["1"]
    discovered: list[int] = []
    monkeypatch.setattr(engine.discovery, "discover", lambda: discovered.append(1))
    header = {"id": "run-1", "saga": "bill", VERSION: "0123456789abcdef"}
    message = SimpleNamespace(headers={"task": "bill.charge", HEADER: header})
    consumer = SimpleNamespace(strategies={"bill.charge": None})
    assert engine.hand_backs.reason(consumer, message) is HandBackReason.VERSION_NOT_HERE
    assert not discovered, "the consumer ran discovery"


def test_a_store_outage_keeps_at_most_one_pending_mark_per_run(
    deploys: dict[str, SagaEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hand-back step of a run not yet marked asks for its mark again; while the store
    is down the marks wait, one per run, and the store gets one write per run when it is
    back (not one per hand-back)."""
    store_back = threading.Event()
    written: list[str] = []

    def mark_waiting(db: Any, execution_id: str, version: str) -> bool:
        store_back.wait(10)
        written.append(execution_id)
        return False  # the store failed: the next hand-back asks again

    monkeypatch.setattr(hand_back_pool, "mark_waiting", mark_waiting)
    marks = Marks(deploys["1"].db)
    for times in range(1, 41):
        for run in ("run-a", "run-b", "run-c"):
            reason = HandBackReason.VERSION_NOT_HERE
            marks.submit(Handed(run, "bill", "bill.charge", "v2", reason, times, 0.5))
    store_back.set()
    time.sleep(0.5)
    assert Counter(written) == {"run-a": 1, "run-b": 1, "run-c": 1}, Counter(written)
