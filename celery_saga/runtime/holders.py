"""Who holds a claim, and asking them before taking it over (guarantee 30).

Every claim names its holder: ``<worker node>/<process id>/<task id>``, written by the claim
statement itself (no extra round trip). A taker that finds a claim it may not simply run
(a lapsed lease, or a redelivery meeting a live one) asks the holder's worker through
``Holders.ask``, which the worker layer answers over Celery's remote control; the pure rule
on the answer is ``decisions/takeover.py``.

The fencing token of the running attempt (its claim's generation: the attempt number, which
grows with every claim of the step or reversal) is readable by the body through
``fencing_token()``, to hand to a downstream system that refuses stale writers.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from celery_saga.decisions.takeover import Answer
from celery_saga.store import queries
from celery_saga.store.database import Database

#: A claim as a taker sees it: whose, and which attempt of what.
ClaimKind = Literal["step", "reversal"]


@dataclass(frozen=True)
class HeldClaim:
    kind: ClaimKind
    execution_id: str
    name: str
    attempt: int
    holder: str | None
    lease_live: bool


def holder_name(node: str, pid: int, task_id: str | None) -> str:
    """``node/pid/task id``, within the 200 characters the store keeps (a task id is at
    most 36, so only an unusually long node name is shortened)."""
    tail = f"/{pid}/{task_id or '-'}"
    return node[: 200 - len(tail)] + tail


def parse_holder(holder: str) -> tuple[str, int, str] | None:
    """(node, pid, task id) of a holder name, or None if it is not one."""
    parts = holder.rsplit("/", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


class Holders:
    """Names this process as a holder and asks other holders; the base class is for a
    process without a worker's remote control (the embedded worker, a script): it names
    itself by host and pid, and can only answer for itself."""

    def me(self) -> str:
        return holder_name(socket.gethostname(), os.getpid(), None)

    def stop(self, holder: str) -> None:
        """Stop the body ``holder`` runs, where the pool can (a cancelled run's, guarantee
        31); without a worker's remote control the body stops at its next
        ``cancelled()`` check, or ends on its own."""

    def ask(self, claim: HeldClaim) -> Answer:
        if _in_this_process(claim.holder):
            return Answer.HELD if runs_here(claim) else Answer.ABSENT
        return Answer.NO_CHANNEL

    def running(self, execution_ids: Collection[str]) -> dict[str, set[str]] | None:
        """The runs among these with an attempt running where this process can ask -> the
        holders running them: before the recovery sweep sends a run's message again, a claim
        the store lost may still have its body running (guarantee 30). None: the question
        could not be asked."""
        return running_here(execution_ids)


def _in_this_process(holder: str | None) -> bool:
    """Whether ``holder`` names this process (its host for a process without a worker
    node name, or any node: a pid and a message are this process's alone while it runs).
    Its own earlier attempt of the same message then runs here or nowhere."""
    parsed = parse_holder(holder or "")
    return (
        parsed is not None
        and parsed[1] == os.getpid()
        and (parsed[2] != "-" or parsed[0] == socket.gethostname())
    )


_token: ContextVar[int | None] = ContextVar("celery_saga_fencing_token", default=None)
#: The attempts whose bodies run in this process now: (kind, execution id, name, attempt)
#: -> the holder its claim names.
_running: dict[tuple[str, str, str, int], str | None] = {}
_running_lock = threading.Lock()


_cancel_check: ContextVar[Callable[[], bool] | None] = ContextVar(
    "celery_saga_cancel_check", default=None
)


@contextmanager
def attempt_running(
    kind: ClaimKind,
    execution_id: str,
    name: str,
    attempt: int,
    *,
    db: Database | None,
    holder: str | None,
) -> Iterator[None]:
    """Mark an attempt (held by ``holder``) as running in this process while the block
    runs, make its attempt number the fencing token its body reads, and let it ask whether
    its run was cancelled (``cancelled()``, one read of the run in ``db``)."""
    key = (kind, execution_id, name, attempt)
    with _running_lock:
        _running[key] = holder
    reset = _token.set(attempt)
    check = _cancel_check.set(None if db is None else lambda: _run_cancelled(db, execution_id))
    try:
        yield
    finally:
        _cancel_check.reset(check)
        _token.reset(reset)
        with _running_lock:
            _running.pop(key, None)


def _run_cancelled(db: Database, execution_id: str) -> bool:
    execution = queries.load_execution(db, execution_id)
    return execution is not None and execution.cancelled_at is not None


def cancelled() -> bool:
    """Whether the run of the step running here was cancelled (guarantee 31): a body that
    the pool cannot stop (a thread or solo pool, a loop that catches everything) checks it
    between units of work and returns early. False outside a step."""
    check = _cancel_check.get()
    return bool(check and check())


def running_here(execution_ids: Collection[str]) -> dict[str, set[str]]:
    """The runs among these with an attempt running in this very process now -> the holders
    their claims name ("" where not known)."""
    wanted, found = set(execution_ids), defaultdict(set)
    with _running_lock:
        for (_, execution_id, _, _), holder in _running.items():
            if execution_id in wanted:
                found[execution_id].add(holder or "")
    return dict(found)


def runs_here(claim: HeldClaim) -> bool:
    """Whether the attempt ``claim`` names runs in this very process now."""
    with _running_lock:
        return (claim.kind, claim.execution_id, claim.name, claim.attempt) in _running


def _forget_after_fork() -> None:
    _running.clear()  # a forked process runs none of its parent's attempts


os.register_at_fork(after_in_child=_forget_after_fork)


def fencing_token() -> int:
    """The fencing token of the step or reversal attempt running here: the generation of
    its claim, larger for every later claim of the same step (or reversal). Pass it with
    each write to a system that keeps the largest token it has seen per idempotency key and
    refuses smaller ones: a body whose claim was taken over then cannot overwrite the newer
    attempt's work. Raises ``RuntimeError`` outside a step or reversal."""
    token = _token.get()
    if token is None:
        raise RuntimeError("fencing_token() is only available inside a saga step or reversal")
    return token
