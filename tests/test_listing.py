"""Listing is paginated, ordered and unbounded in total (guarantee 23, listing part)."""

from __future__ import annotations

import uuid

from celery_saga import ExecutionState
from tests.conftest import Harness


def test_pages_cover_every_run_once_in_creation_order(harness: Harness) -> None:
    tag = uuid.uuid4().hex[:8]
    started = [
        harness.engine.start("five", {"order": n}, execution_id=f"{tag}-{n:02d}") for n in range(7)
    ]
    for run in started:
        run.wait(30)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = harness.engine.list(saga="five", limit=3, cursor=cursor)
        seen.extend(r.id for r in page.items)
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    mine = [i for i in seen if i.startswith(tag)]
    assert mine == [r.id for r in started]
    assert len(seen) == len(set(seen))
    assert pages >= 3


def test_filters_by_state_and_rollback_status(harness: Harness) -> None:
    failed = harness.start("five", {"plan": {"s4": {"fail": True}}})
    failed.wait(30)
    page = harness.engine.list(state="failed", rollback_status=["completed"], limit=1000)
    assert failed.id in {r.id for r in page.items}
    assert all(r.state is ExecutionState.FAILED for r in page.items)
    completed = harness.engine.list(state=ExecutionState.COMPLETED, limit=1000)
    assert failed.id not in {r.id for r in completed.items}
