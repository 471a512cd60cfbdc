"""``celery saga show --follow``: print a run's timeline as it grows, until the run ends;
and who an operator at this shell is, for the history rows of the commands they run."""

from __future__ import annotations

import getpass
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from celery_saga.cli.timeline import render_events

Describe = Callable[[], "dict[str, Any] | None"]
Echo = Callable[[str], None]
#: Timeline entries -> lines to print (text, or JSON lines).
Lines = Callable[[list[dict[str, Any]]], list[str]]


def shell_operator() -> str:
    """``user@host``: the OS user and machine a command ran from, recorded as the actor."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry["at"], entry["depth"], entry["kind"], entry["step"], entry["text"])


def _ended(run: dict[str, Any]) -> bool:
    return run["state"] in ("completed", "failed", "cancelled")


def follow(
    describe: Describe,
    first: dict[str, Any],
    echo: Echo,
    lines: Lines,
    interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """After ``first`` was printed, print each new timeline entry as it appears, every
    ``interval`` seconds, until the run is completed, failed or cancelled (a parked or
    waiting run is followed until an operator or a signal moves it on, or Ctrl-C). Returns
    the run as it ended; None if it was deleted meanwhile."""
    seen = {_key(e) for e in first["timeline"]}
    run = first
    while not _ended(run):
        sleep(interval)
        found = describe()
        if found is None:  # deleted by cleanup meanwhile
            return None
        run = found
        new = [e for e in run["timeline"] if _key(e) not in seen]
        seen.update(_key(e) for e in new)
        for line in lines(new):
            echo(line)
    return run


def _json_lines(entries: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(entry, default=str) for entry in entries]


def follow_until_ended(
    describe: Describe, first: dict[str, Any], echo: Echo, as_json: bool, interval: float
) -> None:
    """``show --follow``: ``follow``, then one line saying how the run ended (a JSON line
    with ``as_json``, as are the entries). Ctrl-C stops it quietly."""
    try:
        ended = follow(describe, first, echo, _json_lines if as_json else render_events, interval)
    except KeyboardInterrupt:  # the operator is done watching: exit status 0
        echo("")
        return
    state = ended["state"] if ended else "deleted (cleaned up)"
    rollback = ended["rollback_status"] if ended else None
    end = {"ended": state, "rollback_status": rollback}
    echo(json.dumps(end) if as_json else f"ended: {state}  rollback={rollback or '-'}")
