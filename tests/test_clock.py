"""Guarantee 25: time and randomness come from one injectable clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_saga import get_clock, set_clock
from celery_saga.decisions.retry import backoff_delay
from celery_saga.runtime.clock import Clock
from celery_saga.testing import ControlledClock


@pytest.fixture
def clock() -> Iterator[ControlledClock]:
    controlled = ControlledClock(datetime(2031, 5, 1, tzinfo=timezone.utc), seed=42)
    previous: Clock = set_clock(controlled)
    yield controlled
    set_clock(previous)


def test_installed_clock_is_the_one_the_engine_reads(clock: ControlledClock) -> None:
    assert get_clock() is clock
    assert get_clock().now() == datetime(2031, 5, 1, tzinfo=timezone.utc)
    clock.advance(90)
    assert get_clock().now() == datetime(2031, 5, 1, 0, 1, 30, tzinfo=timezone.utc)


def _delays(seed: int) -> list[float]:
    clock = ControlledClock(seed=seed)
    return [backoff_delay(attempt, 0.5, 30, clock.random()) for attempt in range(1, 6)]


def test_same_seed_replays_the_same_jitter() -> None:
    assert _delays(9) == _delays(9)
    assert _delays(9) != _delays(10)


def test_clock_refuses_naive_start_and_going_back() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        ControlledClock(datetime(2031, 1, 1))
    with pytest.raises(ValueError, match="forward"):
        ControlledClock().advance(-1)
