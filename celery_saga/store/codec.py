"""msgpack codec for payload columns, sealed by the payload codec when one is configured.

Round-trips exactly: None, bool, int, float, str, bytes, list, dict (str or int keys), and via
extension types datetime, date, time, timedelta, Decimal and UUID. Tuples are stored as lists.
Anything else is refused with a ``PayloadError`` before anything is written, naming the type
and the path of what was refused, never its value (which may be what a saga marks sensitive).

With a payload codec in use (``use_codec``), every packed value leaves as a sealed envelope:
``0xC1`` (a byte msgpack never starts with), a format byte, the key id's length and the key id,
then what the codec made of the msgpack bytes. A value without the marker is plain msgpack,
written before the codec was turned on, and still reads.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import msgpack

from celery_saga.errors import PayloadError, PayloadKeyError


class PayloadCodec(Protocol):
    """Seals packed payloads before they are stored and opens them when read.

    ``seal`` returns the id of the key it used and the sealed bytes; ``open`` is given them
    back and raises ``PayloadKeyError`` for a key id it does not hold. ``key_ids`` lists the
    ids it can open."""

    @property
    def key_ids(self) -> tuple[str, ...]: ...

    def seal(self, data: bytes) -> tuple[str, bytes]: ...

    def open(self, key_id: str, sealed: bytes) -> bytes: ...


SEALED = 0xC1
_FORMAT = 1
_codec: PayloadCodec | None = None


def use_codec(codec: PayloadCodec | None) -> None:
    """Seal every payload this process packs with ``codec`` from now on (None: store plain
    msgpack). One codec per process: the engine sets it from its app's settings."""
    global _codec
    _codec = codec


def current_codec() -> PayloadCodec | None:
    return _codec


def sealed_key(data: bytes | None) -> str | None:
    """The key id a stored payload was sealed with (None: plain msgpack, or no payload)."""
    if not data or data[0] != SEALED:
        return None
    return _envelope(data)[0]


def seal(packed: bytes, codec: PayloadCodec | None = None) -> bytes:
    """``packed`` as it is stored: sealed by ``codec`` (default: the process's codec)."""
    codec = codec or _codec
    if codec is None:
        return packed
    key_id, sealed = codec.seal(packed)
    name = key_id.encode()
    return bytes((SEALED, _FORMAT, len(name))) + name + sealed


def open_sealed(data: bytes, codec: PayloadCodec | None = None) -> bytes:
    """The msgpack bytes of a stored payload, opened by ``codec`` (default: the process's)."""
    if not data or data[0] != SEALED:
        return data
    key_id, sealed = _envelope(data)
    codec = codec or _codec
    if codec is None:
        raise PayloadKeyError(
            key_id,
            f"a payload sealed with key {key_id!r} cannot be read: this process has no payload "
            "codec (set saga_payload_keys, or saga_payload_codec)",
        )
    return codec.open(key_id, sealed)


def _envelope(data: bytes) -> tuple[str, bytes]:
    if len(data) < 3 or data[1] != _FORMAT or len(data) < 3 + data[2]:
        raise PayloadKeyError(
            "?", "a stored payload carries the sealed marker but no valid envelope"
        )
    end = 3 + data[2]
    return data[3:end].decode(errors="replace"), data[end:]


class _Unstorable(PayloadError):
    """Something in a value cannot be stored; ``pack`` finds what and where (``_refused``)."""


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
    raise _Unstorable


#: The longest dict key a path shows whole.
_KEY_SHOWN = 40


def _where(path: tuple[Any, ...]) -> str:
    """A path in a value as a reader writes it: ``card.numbers[0]`` (``the top level``)."""
    text = ""
    for key in path:
        if isinstance(key, str):
            shown = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "..."
            text += f".{shown}" if text else shown
        elif isinstance(key, int):
            text += f"[{key}]"
        else:
            text += f"[<{type(key).__name__}>]"
    return text or "the top level"


def _packs(item: Any) -> bool:
    try:
        msgpack.packb(item, default=_encode_ext, use_bin_type=True, strict_types=False)
    except (PayloadError, TypeError, ValueError, OverflowError):
        return False
    return True


def _refused(value: Any) -> str:
    """What in ``value`` cannot be stored, by its type and path, never by its value: the
    refusal goes into failure texts and logs, where no scrubbing knows a value never stored
    (tests/test_redaction.py). Walked only once packing has failed."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, member in item.items():
                if isinstance(key, tuple) or not _packs(key):
                    return (
                        f"a dictionary key of type {type(key).__name__!r} in {_where(path)} "
                        "cannot be stored and read back as a key; use a str or int key"
                    )
                stack.append((member, (*path, key)))
        elif isinstance(item, (list, tuple)):
            stack.extend((member, (*path, index)) for index, member in enumerate(item))
        elif not _packs(item):
            if isinstance(item, int):
                return (
                    f"the integer at {_where(path)} is outside the 64-bit range that can be stored"
                )
            return (
                f"cannot store a value of type {type(item).__name__!r} at {_where(path)}; "
                "supported: None, bool, int, float, str, bytes, list, tuple, dict, datetime, "
                "date, time, timedelta, Decimal, UUID"
            )
    return "a value in it cannot be stored"


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
                    raise _Unstorable
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
    except _Unstorable:
        raise PayloadError(f"{what}: {_refused(value)}") from None
    except PayloadError as error:
        raise PayloadError(f"{what}: {error}") from None
    except (TypeError, ValueError, OverflowError) as error:
        raise PayloadError(f"{what} cannot be stored: {error}") from None
    if len(packed) > limit:
        raise PayloadError(f"{what} is {len(packed)} bytes once encoded; the limit is {limit}")
    return seal(packed)


@dataclass(frozen=True)
class Sealed:
    """In a listing or ``show``, a payload this process cannot open: it stands in for the
    value, naming the key, so the run's ids, states and times still show without keys."""

    key_id: str

    def __repr__(self) -> str:
        return f"<sealed with key {self.key_id!r}>"

    __str__ = __repr__


def unpack_or_sealed(data: bytes | None) -> Any:
    """``unpack``, or a ``Sealed`` naming the key when this process cannot open it."""
    try:
        return unpack(data)
    except PayloadKeyError as missing:
        return Sealed(missing.key_id)


def unpack(data: bytes | None) -> Any:
    """The value of a stored payload; ``PayloadKeyError`` when it is sealed with a key this
    process does not hold."""
    if data is None:
        return None
    plain = open_sealed(data)
    return msgpack.unpackb(plain, ext_hook=_decode_ext, raw=False, strict_map_key=False)
