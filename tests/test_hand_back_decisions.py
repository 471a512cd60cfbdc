"""The pure decisions of a hand-back (guarantee 22): why a consumer hands a saga message
back, how long the message stays away, which messages a newly started worker can take, and
which missing runs belong to another store, and how a store is named in a message."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from celery_saga.decisions.hand_back import (
    ABSENT_HAND_BACKS,
    SPREAD,
    Arrival,
    HandBackReason,
    Wanted,
    can_take,
    hand_back_reason,
    hold_seconds,
    names_another_store,
    raises_window,
)
from celery_saga.decisions.versions import HAND_BACK_COUNTDOWNS, hand_back_countdown
from celery_saga.store.identity import shown_store, store_identity


def test_a_message_is_handed_back_for_a_task_a_version_or_a_run_this_worker_lacks() -> None:
    reason = hand_back_reason
    assert reason(task_known=False, version_known=None, absent_here=False) is (
        HandBackReason.UNKNOWN_TASK
    )
    assert reason(task_known=True, version_known=False, absent_here=False) is (
        HandBackReason.VERSION_NOT_HERE
    )
    assert reason(task_known=True, version_known=True, absent_here=True) is (
        HandBackReason.RUN_NOT_IN_STORE
    )
    assert reason(task_known=True, version_known=True, absent_here=False) is None
    assert reason(task_known=True, version_known=None, absent_here=False) is None, (
        "a message naming no version goes to the pool: only its run can tell"
    )


@given(
    times=st.integers(min_value=-2, max_value=50),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
    arrived=st.booleans(),
)
def test_a_pause_is_its_backoff_step_spread_and_short_once_a_taker_arrived(
    times: int, draw: float, arrived: bool
) -> None:
    wait = hold_seconds(times, taker_arrived=arrived, draw=draw)
    step = HAND_BACK_COUNTDOWNS[0] if arrived else hand_back_countdown(times)
    assert step * (1 - SPREAD) - 0.01 <= wait <= step * (1 + SPREAD) + 0.01
    assert wait <= HAND_BACK_COUNTDOWNS[-1] * (1 + SPREAD) + 0.01, "a ceiling, whatever the count"


def test_pauses_are_spread_so_workers_do_not_fall_into_step() -> None:
    waits = {hold_seconds(5, taker_arrived=False, draw=d / 10) for d in range(10)}
    assert len(waits) == 10


def test_an_arrived_worker_takes_what_it_has_the_task_version_and_store_for() -> None:
    arrival = Arrival("store-a", frozenset({("order", "v2hash")}), frozenset({"order.audit"}))
    assert can_take(arrival, Wanted("order.audit", "order", "v2hash", "store-a"))
    assert not can_take(arrival, Wanted("order.ship", "order", "v2hash", "store-a")), "task"
    assert not can_take(arrival, Wanted("order.audit", "order", "v3hash", "store-a")), "version"
    assert not can_take(arrival, Wanted("order.audit", "order", "v2hash", "store-b")), "store"
    assert can_take(arrival, Wanted("order.audit", "order", None, None)), "an older message"


def test_only_a_message_naming_another_store_is_checked_against_this_one() -> None:
    assert names_another_store("store-b", "store-a")
    assert not names_another_store("store-a", "store-a"), "a stale message of this store"
    assert not names_another_store(None, "store-a"), "an older release's message"


def test_a_store_is_named_by_where_it_is_never_by_who_reaches_it() -> None:
    same = store_identity("postgresql+psycopg://app:secret@db:5432/shop")
    assert same == store_identity("postgresql://other@db:5432/shop?sslmode=require")
    assert same != store_identity("postgresql+psycopg://app:secret@db:5432/shop_staging")
    assert "secret" not in same and len(same) == 8
    assert "secret" not in shown_store("postgresql+psycopg://app:secret@db:5432/shop")


def test_a_run_absent_here_goes_to_the_store_again_once_handed_back_its_bound() -> None:
    def reason(times: int) -> HandBackReason | None:
        return hand_back_reason(
            task_known=True, version_known=True, absent_here=True, times_handed_back=times
        )

    assert reason(ABSENT_HAND_BACKS - 1) is HandBackReason.RUN_NOT_IN_STORE
    assert reason(ABSENT_HAND_BACKS) is None, (
        "the pool reads the store once more, and drops the message if the run is still absent"
    )


@given(
    prefetch=st.integers(min_value=0, max_value=64), kept=st.integers(min_value=0, max_value=200)
)
def test_a_consumer_raises_its_window_for_at_most_its_prefetch_of_kept_messages(
    prefetch: int, kept: int
) -> None:
    raised = 0
    for _ in range(kept):
        raised += raises_window(raised, prefetch)
    assert raised == min(kept, max(prefetch, 1)), "twice its window at most, in all"
