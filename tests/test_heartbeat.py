"""The lease heartbeat (guarantee 27): a claim's lease is renewed while its block runs, and
no renewal lands after the block has ended (an interrupted attempt gives its claim up right
after; a late renewal would take it back for a whole lease)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

import pytest
from sqlalchemy.exc import OperationalError

from celery_saga.runtime.heartbeat import Heartbeat, LeaseState


def test_a_renewal_in_flight_when_the_claim_ends_lands_before_the_block_is_left() -> None:
    heartbeat = Heartbeat()
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def renew(expiry: datetime) -> bool:
        started.set()
        release.wait(5)
        order.append("renewed")
        return True

    threading.Timer(0.5, release.set).start()
    with heartbeat.keep(renew, lease=0.3, what="a test claim"):
        assert started.wait(5), "the heartbeat renewed nothing"
    order.append("left")
    assert order == ["renewed", "left"]


def test_a_lease_is_renewed_while_the_block_runs_and_never_after() -> None:
    heartbeat = Heartbeat()
    renewals: list[float] = []

    def renew(expiry: datetime) -> bool:
        renewals.append(time.monotonic())
        return True

    with heartbeat.keep(renew, lease=0.3, what="a test claim"):
        time.sleep(0.75)
    count = len(renewals)
    time.sleep(0.3)
    assert count >= 2, renewals  # due every 0.1 s: about 7 in 0.75 s
    assert len(renewals) == count, "renewed after the block ended"


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Guarantee 30's quiet logs: one line per process, not one per body per second."""
    heartbeat = Heartbeat()
    failing_until = time.monotonic() + 2.5
    renewed = threading.Event()

    def renew(expiry: datetime) -> LeaseState:
        if time.monotonic() < failing_until:
            raise OperationalError("UPDATE saga_steps", {}, ConnectionRefusedError("refused"))
        renewed.set()
        return LeaseState.HELD

    caplog.set_level(logging.DEBUG, logger="celery_saga")
    with (
        heartbeat.keep(renew, lease=0.3, what="claim a"),
        heartbeat.keep(renew, lease=0.3, what="claim b"),
    ):
        assert renewed.wait(6)
        time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records if r.name == "celery_saga"]
    assert len([m for m in lines if "unreachable" in m]) == 1, lines
    assert len([m for m in lines if "reachable again after" in m]) == 1, lines
    assert all("\n" not in m for m in lines), lines


@pytest.mark.parametrize(("state", "warned"), [(LeaseState.ENDED, 0), (LeaseState.TAKEN, 1)])
def test_a_lost_lease_is_reported_only_when_it_was_taken_over(
    caplog: pytest.LogCaptureFixture, state: LeaseState, warned: int
) -> None:
    heartbeat = Heartbeat()
    calls: list[float] = []

    def renew(expiry: datetime) -> LeaseState:
        calls.append(time.monotonic())
        return state

    caplog.set_level(logging.WARNING, logger="celery_saga")
    with heartbeat.keep(renew, lease=0.3, what="claim c"):
        time.sleep(0.5)
    taken = [r for r in caplog.records if "taken over" in r.getMessage()]
    assert len(taken) == warned
    assert len(calls) == 1, "a claim that ended or was taken is not renewed again"
