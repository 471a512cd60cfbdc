"""Payload columns as an operator reads them: decoded with the store's codec, what the
saga marks sensitive replaced by ``[redacted]``, shown as JSON where they can be, and a
clear line instead of a crashed page where they cannot."""

from __future__ import annotations

import json
from typing import Any

from celery_saga.definition.sensitivity import DataPath, Sensitivity
from celery_saga.redaction import redact
from celery_saga.store.codec import unpack

#: What a page shows at most of one payload: a run's input may be up to a megabyte.
SHOWN_CHARACTERS = 20_000


def shown(
    blob: bytes | memoryview | None, path: DataPath = (), marks: Sensitivity | None = None
) -> str:
    """The payload ``blob`` (at ``path`` of its run) decoded, redacted by ``marks`` and laid
    out for reading; never raises."""
    if blob is None:
        return "-"
    try:
        value = unpack(bytes(blob))
    except Exception as error:  # a page must show what it can of a corrupt row
        return f"(this payload cannot be decoded: {type(error).__name__}: {error})"
    if marks is not None:
        value = redact(value, path, marks)
    text = json.dumps(value, indent=2, ensure_ascii=False, default=_plain)
    if len(text) > SHOWN_CHARACTERS:
        cut = len(text) - SHOWN_CHARACTERS
        return f"{text[:SHOWN_CHARACTERS]}\n... ({cut} more characters)"
    return text


def _plain(value: Any) -> Any:
    """What JSON has no type for (datetime, Decimal, UUID, bytes): its ``str``."""
    return str(value)
