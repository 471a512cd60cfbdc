"""Stopping a body at its timeout (guarantee 27).

Under Celery's prefork pool the message carries the step's timeout as its soft time limit
(and a hard limit ``hard_limit_grace`` later): the pool raises ``SoftTimeLimitExceeded``
inside the body, and kills the process if the body ignores it. So a timed-out body is
really stopped before the step is retried or any reversal starts. Elsewhere (threads, solo,
in-process) Python cannot stop a thread: the body is abandoned in a daemon thread, and the
docs say so.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from billiard.pool import soft_timeout_sighandler

from celery_saga.errors import StepTimeoutError

_SOFT = getattr(signal, "SIGUSR1", None)


def cut_short(error: BaseException) -> bool:
    """Whether ``error`` is the soft time limit's stop (a step's ``timeout=``, or a cancel's
    revoke: the same signal), or was raised while the body unwound from it. A stop that
    lands inside the body's I/O often leaves it as another error: SQLAlchemy's rollback of
    the connection whose query it interrupted raises ``OperationalError`` ("another command
    is already in progress") from it, and a body may wrap what it caught. So the chain of
    causes and contexts is searched, not only the error the body raised."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, (SoftTimeLimitExceeded, StepTimeoutError)):
            return True
        seen.add(id(current))
        pending += (current.__cause__, current.__context__)
    return False


def pool_enforces_limits() -> bool:
    """Whether this is a prefork pool process whose soft time limits raise in its body."""
    if _SOFT is None or threading.current_thread() is not threading.main_thread():
        return False
    return signal.getsignal(_SOFT) is soft_timeout_sighandler


def shield_from_soft_limit() -> None:
    """Once the body has returned, a late soft limit must not interrupt the write that
    records its outcome: ignore it until ``restore_soft_limit`` (at the task's end)."""
    if pool_enforces_limits():
        assert _SOFT is not None
        signal.signal(_SOFT, signal.SIG_IGN)


def restore_soft_limit() -> None:
    if (
        _SOFT is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(_SOFT) is signal.SIG_IGN
    ):
        signal.signal(_SOFT, soft_timeout_sighandler)


def run_with_timeout(function: Callable[[], Any], timeout: float | None, what: str) -> Any:
    """Run ``function``; past ``timeout`` seconds raise ``StepTimeoutError``.

    In a prefork pool process the pool's soft limit stops the body where it is; elsewhere
    the body runs on in a daemon thread that is given up on.
    """
    if timeout is None:
        return function()
    if pool_enforces_limits():
        try:
            return function()
        except SoftTimeLimitExceeded as stopped:  # its traceback shows where the body was
            raise StepTimeoutError(f"{what} timed out after {timeout:g}s") from stopped
        except Exception as error:
            if not cut_short(error):  # the body's own failure
                raise
            # Stopped inside a query: the driver's rollback failed from the stop.
            raise StepTimeoutError(f"{what} timed out after {timeout:g}s") from error
        finally:
            shield_from_soft_limit()
    return _run_in_thread(function, timeout, what)


def _run_in_thread(function: Callable[[], Any], timeout: float, what: str) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # handed back to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name=f"saga:{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StepTimeoutError(f"{what} timed out after {timeout:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
