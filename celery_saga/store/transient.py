"""Which store errors are worth retrying, and the retry loop every store round trip uses.

A store that drops connections (restart, failover, a network cut, an admin shutdown) or
cannot take new ones yet comes back; an error in what we asked (a constraint, a bad value, a
missing table) does not, nor does a server that answered and refused what the URL names (no
such database, a user it does not accept: ``url_errors``). Only the first kind is retried,
for a budget of seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc

from celery_saga.store import drivers
from celery_saga.store.url_errors import refusal

logger = logging.getLogger("celery_saga")
T = TypeVar("T")

#: Pauses between tries grow from the first to the cap; the cap keeps the write that ends an
#: outage close behind the restore (a sweep must not get there first).
FIRST_DELAY = 0.05
MAX_DELAY = 1.0


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` says the store could not be reached or dropped us (worth a retry).

    SQLAlchemy flags a dropped connection (``connection_invalidated``) but not a failed
    connect, which arrives as a plain ``OperationalError``; on a server database every
    ``OperationalError`` / ``InterfaceError`` is about the connection or the server's state
    (refused, reset, shutdown, deadlock, lock timeout), except a server that answered and
    refused the database or the user. On SQLite only a busy database is.
    """
    if refusal(error) is not None:
        return False
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (exc.DisconnectionError, exc.TimeoutError)):
        return True
    if isinstance(error, (exc.OperationalError, exc.InterfaceError)):
        if drivers.raised_by_sqlite3(error.orig):
            text = str(error.orig).lower()
            return "locked" in text or "busy" in text
        return True
    return False


def retry_transient(
    call: Callable[[], T],
    *,
    budget: float,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``call``; while it fails with a transient store error, try again with capped
    backoff until ``budget`` seconds have passed, then raise the last error.

    ``call`` must be safe to repeat: a read, or a conditional write whose second run after
    a commit whose reply was lost changes nothing (callers check what landed).
    """
    started = monotonic()
    delay = FIRST_DELAY
    failures = 0
    while True:
        try:
            result = call()
        except exc.SQLAlchemyError as error:
            if not is_transient(error):
                raise
            failures += 1
            waited = monotonic() - started
            if waited + delay > budget:
                # The caller's error says it failed; here one line says why and how long.
                logger.warning(
                    "store unreachable for %s after %.1f s (%d tries), giving up: %s",
                    what,
                    waited,
                    failures,
                    describe_store_error(error),
                )
                raise
            if failures == 1:
                logger.warning(
                    "store unreachable for %s, retrying: %s", what, describe_store_error(error)
                )
            sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
            continue
        if failures:
            logger.warning(
                "store reachable again for %s after %.1f s (%d tries)",
                what,
                monotonic() - started,
                failures,
            )
        return result


def describe_store_error(error: BaseException) -> str:
    """The driver's error on one line (SQLAlchemy's adds the statement and a link)."""
    origin = getattr(error, "orig", None) or error
    lines = str(origin).strip().splitlines()
    return f"{type(origin).__name__}: {lines[0]}" if lines else type(origin).__name__
