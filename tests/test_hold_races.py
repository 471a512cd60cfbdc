"""Issue 42: the moves on a held run race each other, a cancel and the hold timeout, 100
runs each, against PostgreSQL from threads of one process (the store's compare-and-set is
what decides, as across hosts): one move lands per run, the charge takes effect at most
once, and every run ends in exactly one of the allowed states."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from celery_saga import ExecutionState, Saga, SagaContext
from celery_saga.errors import InvalidStateError
from celery_saga.store import queries
from tests.conftest import in_process_pg_engine

RUNS = 100


class Provider:
    """A payment provider that is down until told otherwise; its charges, by key."""

    def __init__(self) -> None:
        self.down = True
        self.lock = threading.Lock()
        self.effects: Counter[str] = Counter()

    def charge(self, ctx: SagaContext) -> dict[str, Any]:
        if self.down:
            raise ConnectionError("payment provider down")
        with self.lock:
            self.effects[ctx.execution_id] += 1
        return {"charged": True}


def _saga(provider: Provider, hold_timeout: float | None = None) -> Saga:
    options: dict[str, Any] = {"on_failure": "hold", "retry": 1}
    if hold_timeout is not None:
        options["hold_timeout"] = hold_timeout
    return (
        Saga(f"race{uuid.uuid4().hex[:8]}")
        .step("reserve", lambda: None, compensate=lambda: None)
        .step("charge", provider.charge, compensate=lambda: None, **options)
        .step("ship", lambda: None)
    )


def _until(check: Callable[[], bool], timeout: float = 120) -> None:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def _states(engine: Any, ids: list[str]) -> Counter[ExecutionState]:
    found: Counter[ExecutionState] = Counter()
    for run_id in ids:
        record = queries.load_execution(engine.db, run_id)
        assert record is not None
        found[record.state] += 1
    return found


def _race(*moves: Callable[[], Any]) -> list[str]:
    """Run ``moves`` at once; what each did: "ok", "refused" or the error's type."""
    barrier = threading.Barrier(len(moves))
    results = [""] * len(moves)

    def run(index: int) -> None:
        barrier.wait()
        try:
            moves[index]()
            results[index] = "ok"
        except InvalidStateError:
            results[index] = "refused"
        except Exception as error:
            results[index] = repr(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(moves))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _appended(into: list[Any], call: Callable[[], Any]) -> None:
    into.append(call())


@pytest.fixture
def held_runs() -> Iterator[tuple[Any, Provider, list[str], Saga]]:
    provider = Provider()
    saga = _saga(provider, hold_timeout=1.0)
    with in_process_pg_engine("holdrace", saga, concurrency=4) as engine:
        ids = [engine.start(saga.name, {}).id for _ in range(RUNS)]
        _until(lambda: _states(engine, ids)[ExecutionState.HELD] == RUNS)
        provider.down = False
        yield engine, provider, ids, saga


def _ended(engine: Any, ids: list[str]) -> Counter[ExecutionState]:
    _until(lambda: all(s.is_terminal for s in _states(engine, ids)))
    return _states(engine, ids)


@pytest.mark.services
def test_two_operators_retrying_at_once_retry_once(
    held_runs: tuple[Any, Provider, list[str], Saga],
) -> None:
    engine, provider, ids, _ = held_runs
    outcomes = Counter()
    for run_id in ids:
        results = _race(partial(engine.retry, run_id), partial(engine.retry, run_id))
        outcomes[tuple(sorted(results))] += 1
    assert outcomes == {("ok", "refused"): RUNS}
    assert _ended(engine, ids) == {ExecutionState.COMPLETED: RUNS}
    assert provider.effects == dict.fromkeys(ids, 1)


@pytest.mark.services
def test_retry_against_cancel_ends_each_run_once_and_charges_at_most_once(
    held_runs: tuple[Any, Provider, list[str], Saga],
) -> None:
    engine, provider, ids, _ = held_runs
    for run_id in ids:
        results = _race(partial(engine.retry, run_id), partial(engine.cancel, run_id, "race"))
        assert "ok" in results and all(r in ("ok", "refused") for r in results), results
    ended = _ended(engine, ids)
    assert set(ended) <= {ExecutionState.COMPLETED, ExecutionState.CANCELLED}
    assert sum(ended.values()) == RUNS
    assert all(count == 1 for count in provider.effects.values())


@pytest.mark.services
def test_the_hold_timeout_against_a_retry_lets_exactly_one_of_them_move_the_run(
    held_runs: tuple[Any, Provider, list[str], Saga],
) -> None:
    engine, provider, ids, _ = held_runs
    time.sleep(1.1)  # every hold is due
    sweeps: list[bool] = []
    for run_id in ids:
        sweep = partial(_appended, sweeps, partial(engine.executor.expire_hold, run_id))
        results = _race(partial(engine.retry, run_id), sweep)
        assert results[1] == "ok", results
        assert results[0] in ("ok", "refused"), results
        assert (results[0] == "ok") != sweeps[-1], "exactly one of them moved the run"
    ended = _ended(engine, ids)
    assert set(ended) <= {ExecutionState.COMPLETED, ExecutionState.FAILED}
    retried = ended[ExecutionState.COMPLETED]
    assert sum(provider.effects.values()) == retried, "only a retried run was charged"
    assert sum(sweeps) == ended[ExecutionState.FAILED], "the sweep unwound the rest"
