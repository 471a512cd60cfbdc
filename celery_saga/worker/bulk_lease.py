"""This process's hold on the bulk operation it carries out (``decisions.bulk_lease``): taken
before it acts, renewed before each move once ``RENEW_AFTER`` has passed since the last
renewal, and given up when it finishes or stops on an error. A renewal refused means
another process took the operation over (this one was cut off for longer than a lease):
this one stops before it moves another run."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from functools import cache

from celery_saga.decisions.bulk_lease import (
    Holder,
    LeaseVerdict,
    may_take,
    parse_holder,
    same_process_table,
)
from celery_saga.errors import SagaError
from celery_saga.runtime.clock import get_clock
from celery_saga.store import bulk_operations
from celery_saga.store.bulk_operations import BulkOperation
from celery_saga.store.database import Database
from celery_saga.worker.holders import process_running

logger = logging.getLogger("celery_saga")

#: How long a hold lasts unless renewed: how long a resume waits for a process that
#: vanished without giving the operation up (killed on another machine).
LEASE = timedelta(seconds=30)
#: Seconds after a renewal before the next move renews again (a move takes one more
#: statement at most once a second; a process stalled longer than the lease minus this
#: between renewing and moving is the case the lease cannot fence).
RENEW_AFTER = 1.0


class OperationTakenOver(SagaError):
    """Another process took over the operation this process was carrying out."""


@cache
def _process_table() -> str:
    """This machine's boot and pid namespace: where a pid names the same process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            booted = boot.read().strip()[:8]
        space = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return ""
    return f"{booted}.{space}"


def this_process() -> Holder:
    """A new holder name of this process (one per operation it carries out)."""
    host = socket.gethostname().replace(":", "_")[:120]
    return Holder(host, os.getpid(), _process_table(), uuid.uuid4().hex[:8])


class OperationLease:
    """The hold of ``holder`` on ``operation_id`` (see the module's docstring)."""

    def __init__(self, db: Database, operation_id: str, holder: Holder) -> None:
        self.db, self.operation_id, self.holder = db, operation_id, holder
        self.name = str(holder)
        self._renewed = time.monotonic()

    def take(self, operation: BulkOperation) -> None:
        """Hold ``operation`` (as stored), or raise naming the process that holds it."""
        now = get_clock().now()
        seen = parse_holder(operation.holder)
        alive = None
        if seen is not None and same_process_table(seen, self.holder):
            alive = process_running(seen.pid)
        verdict = may_take(operation.holder, operation.lease_until, now, self.holder, alive)
        if verdict is not LeaseVerdict.HELD and bulk_operations.take(
            self.db, self.operation_id, operation.holder, self.name, now + LEASE
        ):
            self._renewed = time.monotonic()
            if verdict is not LeaseVerdict.FREE:
                logger.warning(
                    "bulk operation %s taken over from %s (%s)",
                    self.operation_id,
                    seen.shown if seen else operation.holder,
                    "its lease lapsed" if verdict is LeaseVerdict.LAPSED else "its process is gone",
                )
            return
        shown = seen.shown if seen is not None else operation.holder or "another process"
        until = f" until {operation.lease_until:%H:%M:%S} UTC" if operation.lease_until else ""
        raise SagaError(
            f"bulk operation {self.operation_id} is being carried out by {shown} (its lease"
            f" runs{until}, renewed as it works); resume it once that process has stopped:"
            f" a process that stopped without giving it up loses it within"
            f" {int(LEASE.total_seconds())} s"
        )

    def keep(self) -> None:
        """Renew the hold if ``RENEW_AFTER`` has passed; raise if it was taken over."""
        if time.monotonic() - self._renewed < RENEW_AFTER:
            return
        renewed_at = time.monotonic()
        if not bulk_operations.renew(
            self.db, self.operation_id, self.name, get_clock().now() + LEASE
        ):
            raise self.lost()
        self._renewed = renewed_at

    def lost(self) -> OperationTakenOver:
        logger.error(
            "bulk operation %s: another process took it over; this one stops here",
            self.operation_id,
        )
        return OperationTakenOver(
            f"bulk operation {self.operation_id} was taken over by another process (this"
            f" one could not renew its lease in time); it stopped before moving another run"
        )

    def let_go(self) -> None:
        """Give the operation up (best effort: a store that is gone lets the lease lapse)."""
        try:
            bulk_operations.let_go(self.db, self.operation_id, self.name)
        except Exception as error:  # the lease lapses on its own
            logger.info("bulk operation %s: not given up (%r)", self.operation_id, error)
