"""The saga coordinates a step's own Celery message carries in its headers.

One header, ``celery_saga``, holds a small dict: for a forward step the execution id, saga,
node, sub-position, parallel member and attempt; for a reversal the execution id, saga,
step and attempt; ``v`` names the version (definition hash) the run is on, ``store`` the
store it lives in (``store/identity.py``). ``resent`` counts the times the engine sent the
same message again because the store was unreachable, ``handed`` the times a worker that
could not run it handed it back (``worker/hand_back.py``; ``marked`` once the run is marked
as waiting for its version, ``absent`` the stores found not holding the run). A message
without the header is a plain call of the task, which runs as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_saga.decisions.admission import NodeMessage

HEADER = "celery_saga"


#: The header key of the version (definition hash) a run is on.
VERSION = "v"
#: The header key counting hand-backs by workers that could not run the message.
HANDED = "handed"
#: The header key naming the store the run lives in (``store.identity.store_identity``).
STORE = "store"
#: The header key listing the stores whose workers found the run missing.
ABSENT = "absent"
#: The header key set once the run is marked as waiting for its version.
MARKED = "marked"


def node_header(saga_name: str, message: NodeMessage, version: str | None = None) -> dict[str, Any]:
    header: dict[str, Any] = {
        "id": message.execution_id,
        "saga": saga_name,
        "node": message.node,
        "sub": message.sub,
        "member": message.member,
        "attempt": message.attempt,
    }
    if version is not None:
        header[VERSION] = version
    return header


#: The header key naming the step a reversal's message reverses. A wire name: messages
#: already in a broker carry it, so it keeps its older spelling ("undo").
REVERSES = "undo"


def reversal_header(
    saga_name: str, execution_id: str, step_name: str, attempt: int, version: str | None = None
) -> dict[str, Any]:
    header = {"id": execution_id, "saga": saga_name, REVERSES: step_name, "attempt": attempt}
    if version is not None:
        header[VERSION] = version
    return header


def version_of(header: Mapping[str, Any] | None) -> str | None:
    """The version a message names (None: sent by a release that did not name it)."""
    value = (header or {}).get(VERSION)
    return value if isinstance(value, str) else None


def node_message(header: Mapping[str, Any]) -> NodeMessage:
    return NodeMessage(
        str(header["id"]),
        int(header["node"]),
        int(header["sub"]),
        int(header["member"]),
        int(header["attempt"]),
    )


def read_header(request: Any) -> dict[str, Any] | None:
    """The saga header of the message ``request`` describes, or None for a plain call.
    A worker merges custom headers into the request; ``apply()`` keeps them under
    ``headers``."""
    header = getattr(request, HEADER, None)
    if header is None:
        header = (getattr(request, "headers", None) or {}).get(HEADER)
    return header if isinstance(header, dict) and "id" in header else None


def describe(header: Mapping[str, Any]) -> str:
    """What Flower and the worker log show as the message's keyword arguments, so a search
    for an execution id finds every message of the run."""
    if REVERSES in header:
        where = f"'{REVERSES}': {header[REVERSES]!r}"
    else:
        where = f"'node': {header['node']}"
        for part in ("sub", "member"):  # a loop's iteration, a parallel group's member
            if header.get(part):
                where += f", {part!r}: {header[part]}"
    return (
        f"{{'saga': {header['saga']!r}, 'execution_id': {header['id']!r}, {where}, "
        f"'attempt': {header['attempt']}}}"
    )
