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


#: Deeper nesting is refused: far beyond any real payload, well inside what msgpack packs
#: and unpacks, and the walk below never recurses, so Python's recursion limit is never met.
MAX_NESTING = 256


def _check_shape(value: Any, limit: int) -> None:
    """Refuse what msgpack would store wrongly or never finish: tuple keys (stored as arrays,
    never read back as keys), cycles, nesting deeper than ``MAX_NESTING``, and more values
    than ``limit`` bytes (each encodes to at least one byte), which a structure sharing
    one list many times can reach long before its packing would end."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    holding: set[int] = set()  # containers on the path from the root to the current item
    seen = 0
    while stack:
        item, depth = stack.pop()
        if depth < 0:  # the marker that leaves a container
            holding.discard(id(item))
            continue
        seen += 1
        if seen > limit:
            raise PayloadError(f"it holds more than {limit} values; the limit is {limit} bytes")
        if not isinstance(item, (dict, list, tuple)):
            continue
        if id(item) in holding:
            raise PayloadError(
                f"it contains itself (a {type(item).__name__} holding a reference to itself "
                "or to a container around it); a cycle cannot be stored"
            )
        if depth > MAX_NESTING:
            raise PayloadError(f"it is nested more than {MAX_NESTING} levels deep")
        holding.add(id(item))
        stack.append((item, -1))
        if isinstance(item, dict):
            for key, member in item.items():
                if isinstance(key, tuple):
                    raise PayloadError(
                        f"dictionary key {key!r} is a tuple, which cannot be "
                        "read back as a key; use a str or int key"
                    )
                stack.extend(((key, depth + 1), (member, depth + 1)))
        else:
            stack.extend((member, depth + 1) for member in item)


def pack(value: Any, *, what: str = "value", limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """Encode ``value``; ``what`` names it in the error (e.g. "input of saga 'order'")."""
    try:
        _check_shape(value, limit)
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
