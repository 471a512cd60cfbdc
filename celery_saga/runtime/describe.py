"""Readable error descriptions for ``failure_reason`` (guarantee 19)."""

from __future__ import annotations


def describe_error(error: BaseException) -> str:
    """``Type: message``, or just ``Type`` when the message is empty."""
    message = str(error)
    name = type(error).__name__
    return f"{name}: {message}" if message else name
