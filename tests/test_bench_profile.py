"""The benchmark's profile measures the hot path as it runs unprofiled, and splits hops."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import column, create_engine, insert, table, text

from celery_saga.store import drivers
from celery_saga.store.database import Database
from tests.conftest import PORTS, ROOT, _test_database_url, require_services

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_hop_split
import bench_profile


@pytest.fixture
def counted() -> Iterator[None]:
    original = Database._count
    bench_profile.count_store_statements()
    try:
        yield
    finally:
        Database._count = original  # type: ignore[method-assign]
        bench_profile._current = None


def test_a_profiled_store_still_sends_its_hot_path_straight_to_the_driver(counted: None) -> None:
    require_services(PORTS["postgres"])
    db = Database(_test_database_url())
    try:
        probe = table("pg_class", column("relname"))
        bench_profile._current = {"statements": 0, "durable": 0}
        with db.single_statement() as connection:
            # A listener of the engine's statement events would turn this off.
            assert db.driver.direct(connection)
            drivers.rows(connection, probe.select().limit(1), {})
        assert bench_profile._current["statements"] == 1
    finally:
        db.dispose()


def _task(kind: str, run: str, start: float, **stamps: float) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in bench_profile.COLUMNS}
    row.update(ts=start + 0.003, pid=1, kind=kind, run_id=run, t_start=start, t_end=start + 0.003)
    row.update(stamps)
    return row


def _node(kind: str, run: str, start: float, last: bool = False) -> dict[str, Any]:
    """A task whose parts take 0.1 ms to its claim, 0.5 ms claiming, 0.2 ms to its outcome,
    0.7 ms writing it, then 0.8 ms publishing (none if ``last``)."""
    ms = 0.001
    stamps = {
        "t_claim_in": start + 0.1 * ms,
        "t_claim_out": start + 0.6 * ms,
        "t_record_in": start + 0.8 * ms,
        "t_record_out": start + 1.5 * ms,
    }
    if not last:
        stamps["t_publish_out"] = start + 2.3 * ms
    return _task(kind, run, start, **stamps)


def test_a_hop_is_split_into_its_parts_between_consecutive_tasks_of_a_run() -> None:
    engine = create_engine("sqlite://")
    ms = 0.001
    with engine.begin() as connection:
        connection.execute(text(bench_profile.CREATE_TABLE))
        rows = [
            # A forward run: 1.0 ms from each publish to the next task's start.
            *(_node("saga", "f", 100 + i * 3.3 * ms, last=i == 2) for i in range(3)),
            # An unwinding run's reversals: 1.5 ms from publish to start.
            *(_node("reversal", "r", 200 + i * 3.8 * ms, last=i == 2) for i in range(3)),
            _task("chain", None, 300),  # not a saga task: left out
        ]
        profile = table(bench_profile.PROFILE_TABLE, *(column(c) for c in bench_profile.COLUMNS))
        connection.execute(insert(profile), rows)
        parts = bench_hop_split.split(connection, 0, 400)
    engine.dispose()
    forward, reversal = parts["forward"], parts["reversal"]
    assert len(forward["hop"]) == 2 and len(reversal["hop"]) == 2
    assert forward["hop"] == pytest.approx([3.3, 3.3])
    assert reversal["hop"] == pytest.approx([3.8, 3.8])
    assert forward["delivery"] == pytest.approx([1.0, 1.0])
    assert reversal["delivery"] == pytest.approx([1.5, 1.5])
    for name, expected in (("outcome write", 0.7), ("events, publish", 0.8), ("claim", 0.5)):
        assert forward[name] == pytest.approx([expected] * 2)
    lines = bench_hop_split.report(parts)
    assert any(line.split()[:1] == ["delivery"] and line.endswith("+0.500") for line in lines)
