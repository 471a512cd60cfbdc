"""Whether an attempt was cut short by its worker's own shutdown (guarantee 27).

A pool process stopped by its worker (the SIGTERM that ``systemctl restart`` sends to the
whole process group, a cold shutdown) unwinds the body it runs with ``SystemExit``. That is
the worker going away, not the step failing: the attempt records no outcome, counts as a
lost-worker attempt, and gives its claim up so the step runs again at once on the next
worker. A body's own ``sys.exit()`` stays a failure. Which is which only the worker layer
can tell (the pool records that its terminate handler fired); it installs that test here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("celery_saga")

#: Seconds before the message an interrupted attempt sends again is due. A message due at
#: once could be taken by its own stopping worker and acknowledged as it dies (early ack);
#: one with a countdown waits in a worker's timer unacknowledged, so a worker that stops
#: before it is due hands it back to the broker.
RESEND_AFTER = 1.0

#: ``probe(error)``: True when ``error`` unwinds an attempt because its process is stopping.
Probe = Callable[[BaseException], bool]


def _never(error: BaseException) -> bool:
    return False


_probe: Probe = _never


def set_probe(probe: Probe) -> None:
    global _probe
    _probe = probe


def worker_is_stopping(error: BaseException) -> bool:
    """Whether ``error`` is this process's shutdown reaching the attempt, not the body's."""
    return _probe(error)


def give_up(
    give_up_claim: Callable[[], bool], send_again: Callable[[], None], where: str, what: str
) -> str:
    """What an interrupted attempt does on its way out: end its claim's lease (a
    compare-and-set: only while the claim is still this attempt's), then send its message
    again. Leaves one log line saying when it runs again; returns its description."""
    given_up = resent = False
    try:
        given_up = give_up_claim()
        if given_up:
            send_again()
            resent = True
    except Exception as failure:  # the store or broker is going away too
        logger.debug("%s: %s not handed on: %r", where, what, failure)
    if resent:
        then = "it runs again on the next worker"
    elif given_up:
        then = "it runs again when its message is redelivered or the recovery sweep finds it"
    else:
        then = "it runs again once its lease ends"
    logger.warning(
        "%s: %s was interrupted by its worker's shutdown; not a failure: %s", where, what, then
    )
    return f"{what} of {where} interrupted by the worker's shutdown"
