"""The body of the Celery task whose own message runs this step or reversal.

A step's task calls its body in place (``worker/step_run``), and ends the way the body did:
with the body's own exception when it raised, which ``body_error`` hands to the outcome.
A timeout is the body's ending too: ``timed_out`` makes the ``StepTimeoutError`` the body's
error, so its task is a FAILURE with the exception the run's ``failure_reason`` names and
the next attempt is a task of its own, whether the body was sync or async, on any pool.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery_saga.errors import StepTimeoutError


@dataclass
class RunningBody:
    """The body of the Celery task whose own message is running this step or reversal, as
    its wrapper hands it over: called in place, under the task's request, so ``self.request``
    is the message's and Celery's hooks see what it returned or raised."""

    task_name: str
    function: Any
    call: Callable[[dict[str, Any]], Any]
    task_id: str | None = None
    header: Mapping[str, Any] | None = None
    #: What the body raised, if it did: the task then ends with it (``body_error``).
    error: BaseException | None = None

    def runs(self, target: Any) -> bool:
        """Whether ``target`` (a step's action or compensation) is this task's body."""
        return target is self.function or getattr(target, "name", None) == self.task_name

    def __call__(self, kwargs: dict[str, Any]) -> Any:
        try:
            value = self.call(kwargs)
        except BaseException as error:
            self._raised(error)
            raise
        return self._awaited(value) if inspect.iscoroutine(value) else value

    async def _awaited(self, coroutine: Any) -> Any:
        """An async body's error, raised while it is awaited, is the body's own as well."""
        try:
            return await coroutine
        except asyncio.CancelledError:
            raise  # its timeout (runtime/async_bodies), not an error of the body's
        except BaseException as error:
            self._raised(error)
            raise

    def _raised(self, error: BaseException) -> None:
        # A body given up on at its timeout (threads pool) may raise later, in its own
        # thread: the attempt has already ended with the timeout.
        if not isinstance(self.error, StepTimeoutError):
            self.error = error


running_body: ContextVar[RunningBody | None] = ContextVar("running_body", default=None)


def body_error() -> BaseException | None:
    """What the running task's own body raised (None: it did not, or no task body runs
    here): a failed attempt's outcome carries it, so the task ends with the user's own
    exception, as a plain call would."""
    body = running_body.get()
    return None if body is None else body.error


def body_of(target: Any) -> Callable[[dict[str, Any]], Any]:
    """How to call ``target`` with keyword arguments: through the running task's own body
    when its message is the one being handled, else directly."""
    body = running_body.get()
    if body is not None and body.runs(target):
        return body
    return lambda kwargs: target(**kwargs)


def timed_out(target: Any, error: StepTimeoutError) -> None:
    """``target``'s body ran past its timeout: when it is the running task's own body, that
    task ends with ``error`` (FAILURE, as for any exception of the body's), not with a
    retry of its own id or a wrapper (tests/test_timeout_endings.py)."""
    body = running_body.get()
    if body is not None and body.runs(target):
        body.error = error
