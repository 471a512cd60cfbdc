"""Retrying a store write the database refused (a lock timeout, a dropped connection)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.runtime.describe import describe_error

logger = logging.getLogger("celery_saga")
T = TypeVar("T")


def keep_cause(delays: Sequence[float], cause: Exception | None, write: Callable[[], T]) -> T:
    """Run ``write``, retrying after each of ``delays`` while the store refuses it.

    With ``cause`` (a step's error being recorded) a store that keeps refusing raises
    ``cause`` itself, so the step's error is never replaced by the store's (guarantee 19);
    without one, the last store error. The writes retried are conditional, so a retry after
    a write that did commit changes nothing and reports the claim as lost.
    """
    for delay in (*delays, None):
        try:
            return write()
        except SQLAlchemyError as store_error:
            what = f"the failure record of {describe_error(cause)}" if cause else "an outcome"
            logger.warning("store refused %s: %s", what, describe_error(store_error))
            if delay is None:
                if cause is None:
                    raise
                raise cause from store_error
            time.sleep(delay)
    raise AssertionError("unreachable")
