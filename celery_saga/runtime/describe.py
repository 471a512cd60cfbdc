"""Readable error descriptions for ``failure_reason`` (guarantee 19)."""

from __future__ import annotations


def describe_error(error: BaseException) -> str:
    """``Type: message``, or just ``Type`` when the message is empty.

    An exception whose ``__str__`` itself raises is still described (by its type), so a
    step that raises one fails like any other instead of failing the worker (guarantee 27).
    """
    name = type(error).__name__
    try:
        message = str(error)
    except Exception as broken:
        message = f"<message unavailable: {type(broken).__name__}>"
    return f"{name}: {message}" if message else name
