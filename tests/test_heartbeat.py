"""The lease heartbeat (guarantee 27): a claim's lease is renewed while its block runs, and
no renewal lands after the block has ended (an interrupted attempt gives its claim up right
after; a late renewal would take it back for a whole lease)."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from celery_saga.runtime.heartbeat import Heartbeat


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
