"""Keeping a claim's lease alive while its body runs (guarantee 27).

A lease says "a worker is on it": a duplicate or recovered message finding a live lease
leaves the step alone. Renewed every third of its length by one daemon thread per process,
a lease outlives any healthy body however long, and lapses within ``lease_seconds`` of the
worker dying, so the step is picked up again promptly instead of after a fixed guess.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery_saga.runtime.clock import get_clock
from celery_saga.store.transient import describe_store_error

logger = logging.getLogger("celery_saga")

#: Seconds before a renewal the store refused is tried again.
RETRY_AFTER_FAILURE = 1.0


class LeaseState(str, enum.Enum):
    """What a renewal found: the attempt still holds its claim (renewed), its claim ended
    (its outcome was recorded meanwhile), or another attempt claimed it (taken over)."""

    HELD = "held"
    ENDED = "ended"
    TAKEN = "taken"


#: ``renew(new_expiry)`` extends the lease if this attempt still holds it (a bare False
#: means taken over).
Renewal = Callable[[datetime], "LeaseState | bool"]


@dataclass
class _Claim:
    renew: Renewal
    lease: float
    due: float
    what: str


class Heartbeat:
    """Renews the leases of the claims registered with ``keep`` until they end."""

    def __init__(self, interval_fraction: float = 1 / 3) -> None:
        self._fraction = interval_fraction
        self._claims: dict[int, _Claim] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        #: Tokens whose renewal is being written now: ``keep`` waits for it on the way out.
        self._renewing: set[int] = set()
        self._renewed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        #: When renewals started failing (monotonic), while the store is unreachable.
        self._outage_since: float | None = None

    @contextmanager
    def keep(self, renew: Renewal, lease: float, what: str) -> Iterator[None]:
        """Renew the lease of ``what`` while the block runs."""
        with self._lock:
            token = next(self._ids)
            due = time.monotonic() + lease * self._fraction
            self._claims[token] = _Claim(renew, lease, due, what)
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._claims.pop(token, None)
                # A renewal already on its way would land after what the caller writes next
                # (an interrupted attempt gives its claim up): wait for it, boundedly.
                self._renewed.wait_for(lambda: token not in self._renewing, timeout=5.0)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="saga-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [(t, c) for t, c in self._claims.items() if c.due <= now]
                for token, claim in due:
                    claim.due = now + claim.lease * self._fraction
                    self._renewing.add(token)
                pause = min((c.due for c in self._claims.values()), default=now + 1.0) - now
            for token, claim in due:
                try:
                    with self._lock:
                        ended = token not in self._claims  # its block ended since
                    if not ended:
                        self._renew(token, claim)
                finally:
                    with self._lock:
                        self._renewing.discard(token)
                        self._renewed.notify_all()
            time.sleep(max(0.05, min(pause, 1.0)))

    def _renew(self, token: int, claim: _Claim) -> None:
        expiry = get_clock().now() + timedelta(seconds=claim.lease)
        try:
            state = claim.renew(expiry)
        except Exception as error:
            # The store is unreachable: try again in a second, so the lease is renewed as
            # soon as the store is back. One line per process for the whole outage.
            self._store_lost(error)
            with self._lock:
                claim.due = time.monotonic() + RETRY_AFTER_FAILURE
            return
        self._store_back()
        if state is True or state is LeaseState.HELD:
            return
        if state is False or state is LeaseState.TAKEN:
            logger.warning(
                "the claim of %s was taken over by another worker while its body ran; its "
                "outcome will not be recorded as the step's",
                claim.what,
            )
        with self._lock:
            self._claims.pop(token, None)

    def _store_lost(self, error: BaseException) -> None:
        with self._lock:
            if self._outage_since is not None:
                return
            self._outage_since = time.monotonic()
            held = len(self._claims)
        logger.warning(
            "the saga store is unreachable (%s): %d claim(s) held here keep their bodies "
            "running; their leases are renewed as soon as it is back",
            describe_store_error(error),
            held,
        )

    def _store_back(self) -> None:
        with self._lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            logger.warning(
                "the saga store is reachable again after %.1f s; leases renewed",
                time.monotonic() - since,
            )


_heartbeat = Heartbeat()


def _reset_after_fork() -> None:
    # The parent's thread does not exist in a forked child; the child starts its own.
    global _heartbeat
    _heartbeat = Heartbeat()


os.register_at_fork(after_in_child=_reset_after_fork)


def keep_lease(renew: Renewal, lease: float, what: str) -> AbstractContextManager[None]:
    """Renew a lease while the ``with`` block runs (one thread per process does it)."""
    return _heartbeat.keep(renew, lease, what)
