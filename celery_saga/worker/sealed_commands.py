"""The arguments of a handed-on command, sealed by the payload codec.

A ``celery_saga.command`` message (a signal, resume or cancel handed on by a process without
the run's version, see ``run_commands``) is carried out in the name of its ``actor``. With a
payload codec configured, anyone who may publish to the broker could otherwise send one
unsealed, in anyone's name. So the sender seals the arguments (payload and actor) in one
envelope that also names the run and the command, and the worker refuses a command whose
arguments are not sealed, do not open, or were sealed for another run or command. Without
a codec there is no key to seal with: the arguments travel as they are, as before.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from celery_saga.errors import PayloadError, PayloadKeyError, SagaError
from celery_saga.store.codec import SEALED, current_codec, pack, unpack

#: The one argument a sealed command carries: the envelope, base64.
SEALED_ARGUMENTS = "sealed"


class UnsealedCommand(SagaError):
    """A handed-on command whose arguments a worker with a payload codec does not trust."""


def seal_arguments(execution_id: str, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as the message carries them: sealed with the run and the command when
    this process has a codec, else as they are."""
    if current_codec() is None:
        return arguments
    envelope = pack(
        {"id": execution_id, "command": command, "arguments": arguments},
        what=f"the {command} handed on for execution {execution_id!r}",
    )
    return {SEALED_ARGUMENTS: base64.b64encode(envelope).decode("ascii")}


def open_arguments(execution_id: str, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a command received for ``execution_id``; ``UnsealedCommand`` says
    why they are refused."""
    if SEALED_ARGUMENTS not in arguments:
        if current_codec() is not None:
            raise UnsealedCommand(
                "its arguments are not sealed, and this worker has a payload codec: only a "
                "process holding the payload key may hand a command on (a forged message, "
                "or one from a release before sealed commands)"
            )
        return arguments
    envelope = _envelope(arguments[SEALED_ARGUMENTS])
    try:
        opened = unpack(envelope)
    except (PayloadKeyError, PayloadError, ValueError) as refused:
        raise UnsealedCommand(f"its sealed arguments do not open: {refused}") from None
    if (
        not isinstance(opened, dict)
        or opened.get("id") != execution_id
        or opened.get("command") != command
        or not isinstance(opened.get("arguments"), dict)
    ):
        raise UnsealedCommand("its arguments were sealed for another run or command")
    return opened["arguments"]  # type: ignore[no-any-return]


def _envelope(value: Any) -> bytes:
    try:
        envelope = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        envelope = b""
    if not envelope or envelope[0] != SEALED:
        raise UnsealedCommand("its arguments are not sealed (no sealed envelope)")
    return envelope
