"""``celery saga show --follow``: print a run's timeline as it grows, until the run ends;
and who an operator at this shell is, for the history rows of the commands they run."""

from __future__ import annotations

import getpass
import json
import socket
import time
from collections.abc import Callable, Sequence

from celery_saga.inspect.jsonable import entry_json
from celery_saga.inspect.text import timeline_lines
from celery_saga.inspect.values import RunView, TimelineEntry

Describe = Callable[[], "RunView | None"]
Echo = Callable[[str], None]
#: Timeline entries -> lines to print (text, or JSON lines).
Lines = Callable[[Sequence[TimelineEntry]], list[str]]


def shell_operator() -> str:
    """``user@host``: the OS user and machine a command ran from, recorded as the actor."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _key(entry: TimelineEntry) -> tuple[object, ...]:
    return (entry.at, entry.depth, entry.kind, entry.step, entry.text)


def _ended(run: RunView) -> bool:
    return run.state in ("completed", "failed", "cancelled")


def follow(
    describe: Describe,
    first: RunView,
    echo: Echo,
    lines: Lines,
    interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> RunView | None:
    """After ``first`` was printed, print each new timeline entry as it appears, every
    ``interval`` seconds, until the run is completed, failed or cancelled (a parked or
    waiting run is followed until an operator or a signal moves it on, or Ctrl-C). Returns
    the run as it ended; None if it was deleted meanwhile."""
    seen = {_key(e) for e in first.timeline.entries}
    run = first
    while not _ended(run):
        sleep(interval)
        found = describe()
        if found is None:  # deleted by cleanup meanwhile
            return None
        run = found
        new = [e for e in run.timeline.entries if _key(e) not in seen]
        seen.update(_key(e) for e in new)
        for line in lines(new):
            echo(line)
    return run


def _json_lines(entries: Sequence[TimelineEntry]) -> list[str]:
    return [entry_json(entry) for entry in entries]


def follow_until_ended(
    describe: Describe, first: RunView, echo: Echo, as_json: bool, interval: float
) -> None:
    """``show --follow``: ``follow``, then one line saying how the run ended (a JSON line
    with ``as_json``, as are the entries). Ctrl-C stops it quietly."""
    try:
        ended = follow(describe, first, echo, _json_lines if as_json else timeline_lines, interval)
    except KeyboardInterrupt:  # the operator is done watching: exit status 0
        echo("")
        return
    state = ended.state if ended else "deleted (cleaned up)"
    rollback = ended.rollback_status if ended else None
    end = {"ended": state, "rollback_status": rollback}
    echo(json.dumps(end) if as_json else f"ended: {state}  rollback={rollback or '-'}")
