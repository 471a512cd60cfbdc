"""msgpack codec for payload columns.

Round-trips exactly: None, bool, int, float, str, bytes, list, dict (str or int keys), and via
extension types datetime, date, time, timedelta, Decimal and UUID. Tuples are stored as lists.
Anything else is refused with a ``PayloadError`` before anything is written.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import msgpack

from celery_saga.errors import PayloadError

_DATETIME, _DATE, _TIME, _TIMEDELTA, _DECIMAL, _UUID = range(1, 7)
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


def _encode_ext(value: Any) -> msgpack.ExtType:
    # datetime before date: datetime is a subclass of date.
    if isinstance(value, dt.datetime):
        return msgpack.ExtType(_DATETIME, value.isoformat().encode())
    if isinstance(value, dt.date):
        return msgpack.ExtType(_DATE, value.isoformat().encode())
    if isinstance(value, dt.time):
        return msgpack.ExtType(_TIME, value.isoformat().encode())
    if isinstance(value, dt.timedelta):
        packed = msgpack.packb([value.days, value.seconds, value.microseconds])
        return msgpack.ExtType(_TIMEDELTA, packed)
    if isinstance(value, Decimal):
        return msgpack.ExtType(_DECIMAL, str(value).encode())
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_UUID, value.bytes)
    if isinstance(value, int):
        raise PayloadError(f"integer {value} is outside the 64-bit range that can be stored")
    raise PayloadError(
        f"cannot store a value of type {type(value).__name__!r} ({value!r:.80}); supported: "
        "None, bool, int, float, str, bytes, list, tuple, dict, datetime, date, time, "
        "timedelta, Decimal, UUID"
    )


def _decode_ext(code: int, data: bytes) -> Any:
    if code == _DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == _DATE:
        return dt.date.fromisoformat(data.decode())
    if code == _TIME:
        return dt.time.fromisoformat(data.decode())
    if code == _TIMEDELTA:
        days, seconds, microseconds = msgpack.unpackb(data)
        return dt.timedelta(days=days, seconds=seconds, microseconds=microseconds)
    if code == _DECIMAL:
        return Decimal(data.decode())
    if code == _UUID:
        return uuid.UUID(bytes=data)
    return msgpack.ExtType(code, data)


def _check_keys(value: Any) -> None:
    """msgpack would store a tuple key as an array that can never be read back as a key."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, tuple):
                raise PayloadError(
                    f"dictionary key {key!r} is a tuple, which cannot be "
                    "read back as a key; use a str or int key"
                )
            _check_keys(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_keys(item)


def pack(value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """Encode ``value``; ``what`` names it in the error (e.g. "input of saga 'order'")."""
    try:
        _check_keys(value)
        packed: bytes = msgpack.packb(
            value, default=_encode_ext, use_bin_type=True, strict_types=False
        )
    except PayloadError as error:
        raise PayloadError(f"{what}: {error}") from None
    except (TypeError, ValueError, OverflowError) as error:
        raise PayloadError(f"{what} cannot be stored: {error}") from None
    if len(packed) > limit:
        raise PayloadError(f"{what} is {len(packed)} bytes once encoded; the limit is {limit}")
    return packed


def unpack(data: bytes | None) -> Any:
    if data is None:
        return None
    return msgpack.unpackb(data, ext_hook=_decode_ext, raw=False, strict_map_key=False)
