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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from celery_saga.decisions.takeover import Answer

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

    def ask(self, claim: HeldClaim) -> Answer:
        return Answer.NO_CHANNEL


_token: ContextVar[int | None] = ContextVar("celery_saga_fencing_token", default=None)


@contextmanager
def fenced_by(token: int) -> Iterator[None]:
    """Make ``token`` the running attempt's fencing token while the block runs."""
    reset = _token.set(token)
    try:
        yield
    finally:
        _token.reset(reset)


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
