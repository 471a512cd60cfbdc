"""Whether a body cut short in a run being cancelled was stopped by the cancel (guarantee 31).

The cancel revokes the task running a body (``Holders.stop``), which the prefork pool
delivers as the soft time limit's signal: the same ``SoftTimeLimitExceeded`` that a step's
own ``timeout=`` raises, so the pool process cannot tell the two apart. Only the worker's
main process knows: its revoke announced the task REVOKED (``task-revoked``), and the task
must then send nothing more, while a timeout that no revoke announced ends the task as a
failure, or it would stay STARTED. The worker layer installs that test here.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``probe(holder)``: True when the worker running ``holder`` announced its task revoked.
Probe = Callable[[str | None], bool]


def _never(holder: str | None) -> bool:
    return False


_probe: Probe = _never


def set_probe(probe: Probe) -> None:
    global _probe
    _probe = probe


def stopped_by_revoke(holder: str | None) -> bool:
    """Whether the body that ``holder`` ran was stopped by a revoke of its task that its
    worker announced (without a worker, no body is ever revoked)."""
    return _probe(holder)
