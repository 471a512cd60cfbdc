"""Writing down what already happened through store outages (guarantees 19, 20, 26).

Once a step's body or a reversal has run, its record is the only thing that stops it from
running again. That write is retried for ``outcome_retry_budget`` seconds; before each
retry the store is asked whether an earlier try committed after all (its reply may have
been lost with the connection), so a retry never reports a write of ours as someone
else's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError

from celery_saga.store.transient import retry_transient

T = TypeVar("T")


def write_outcome(
    write: Callable[[], T],
    *,
    budget: float,
    what: str,
    landed: Callable[[], bool],
    if_landed: T,
    cause: BaseException | None = None,
    restore: Callable[[], bool] | None = None,
) -> T:
    """Run the conditional ``write``, retrying transient store errors for ``budget`` s.

    Before a retry, ``landed()`` says whether an earlier try committed after all; if so
    the write is not repeated and ``if_landed`` is returned. With ``cause`` (a step's error
    being recorded), a store that stays unreachable raises ``cause`` itself, so the step's
    error is never replaced by the store's (guarantee 19); without one, the last store error.
    A write that matched nothing (a falsy result) asks ``restore()`` whether the store had
    lost the claim and its holder wrote it back; then it is written once more (guarantee 30).
    """
    tried = False

    def once() -> T:
        nonlocal tried
        if tried and landed():
            return if_landed
        tried = True
        result = write()
        if not result and restore is not None and restore():
            result = write()
        return result

    try:
        return retry_transient(once, budget=budget, what=what)
    except SQLAlchemyError as store_error:
        if cause is None:
            raise
        raise cause from store_error
