"""Run ids are version-7 UUIDs: unique, and in the order the runs were started, so the
store's indexes on a run's id take new rows at their end (docs/scaling.md)."""

from __future__ import annotations

import time
import uuid
from unittest import mock

from celery_saga import ids
from celery_saga.ids import uuid7
from tests.conftest import Harness


def test_ids_are_version_7_with_the_time_of_their_making() -> None:
    before = time.time_ns() // 1_000_000
    made = uuid7()
    after = time.time_ns() // 1_000_000
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after


def test_ids_made_one_after_another_sort_in_that_order_and_never_repeat() -> None:
    made = [str(uuid7()) for _ in range(20_000)]
    assert len(set(made)) == len(made)
    assert made == sorted(made)


def test_runs_started_without_an_id_get_version_7_ids_in_start_order(
    sqlite_harness: Harness,
) -> None:
    started = [sqlite_harness.engine.start("five", {"order": n}).id for n in range(5)]
    assert all(uuid.UUID(run).version == 7 for run in started)
    assert started == sorted(started)


def test_ids_stay_in_order_when_the_clock_stands_still_or_steps_back() -> None:
    """A coarse clock (one tick for many ids) or one stepped back by NTP does not break the
    order: the 4096ths of the millisecond count on from the last id."""
    frozen = time.time_ns()
    with mock.patch.object(ids.time, "time_ns", return_value=frozen):
        still = [str(uuid7()) for _ in range(5000)]  # more than 4096 in one millisecond
    with mock.patch.object(ids.time, "time_ns", return_value=frozen - 60 * 10**9):
        back = [str(uuid7()) for _ in range(10)]
    made = still + back
    assert made == sorted(made) and len(set(made)) == len(made)
