"""Payloads encrypted at rest: an AES-GCM payload codec with key ids, and the settings that
choose a codec (the ``encryption`` extra).

    app.conf.saga_payload_keys = PayloadKeys.from_environment({"2026-12": "SAGA_KEY_2026_12"})

Every payload the engine stores (a run's input, step results, signal payloads, decisions,
history data) is then sealed with the newest key (the last one listed, or
``saga_payload_key``) and opened with the key its envelope names, so adding a key rotates
without rewriting history; ``celery saga db reencrypt`` moves old rows to the newest key.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import os
from collections.abc import Mapping
from typing import Any

from celery_saga.errors import PayloadKeyError
from celery_saga.store.codec import PayloadCodec

_NONCE_BYTES = 12
_KEY_BYTES = (16, 24, 32)


class PayloadKeys:
    """The value of ``saga_payload_keys``: key id -> key (16, 24 or 32 bytes, or their
    URL-safe base64), held so that nothing that prints it shows a key. Its ``repr`` names
    the ids only, and it is not a mapping: Celery's censor, behind ``celery report`` and
    ``celery inspect conf``, recurses into a mapping and masks by the inner names, so a
    plain dict of keys would be printed whole by an app without an engine."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes | str]) -> None:
        if not isinstance(keys, Mapping):
            raise ValueError("PayloadKeys takes a mapping of key id to key")
        self._keys = dict(keys)

    @classmethod
    def from_environment(cls, variables: Mapping[str, str]) -> PayloadKeys:
        """Each key read from the environment variable named for its id:
        ``PayloadKeys.from_environment({"2026-12": "SAGA_KEY_2026_12"})``."""
        keys = {}
        for key_id, name in variables.items():
            value = os.environ.get(name)
            if not value:
                raise ValueError(
                    f"the environment variable {name!r} holding payload key {key_id!r} "
                    "is not set (make a key with `celery saga db new-key`)"
                )
            keys[key_id] = value
        return cls(keys)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def material(self) -> Mapping[str, bytes | str]:
        """The keys themselves, for the codec."""
        return dict(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"PayloadKeys({', '.join(repr(key_id) for key_id in self._keys)})"

    __str__ = __repr__


def new_key() -> str:
    """A fresh 256-bit key, URL-safe base64, for ``saga_payload_keys``."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


class AESGCMCodec:
    """AES-GCM (``cryptography``) with a 96-bit random nonce per payload; the key id is
    authenticated with it, so a payload cannot be opened under another id's name.

    ``keys``: key id -> key (16, 24 or 32 bytes, or their URL-safe base64); ``current``:
    the id new payloads are sealed with (default: the last one in ``keys``)."""

    def __init__(self, keys: Mapping[str, bytes | str], current: str | None = None) -> None:
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # pragma: no cover - the extra is missing
            raise ImportError(
                'payload encryption needs the "encryption" extra (cryptography)'
            ) from None
        if not keys:
            raise ValueError("saga_payload_keys is empty: give at least one key id and key")
        self._refused = InvalidTag  # imported once, not on every payload read
        self._ciphers = {key_id: AESGCM(_key_bytes(key_id, key)) for key_id, key in keys.items()}
        for key_id in self._ciphers:
            _check_key_id(key_id)
        self.current = current if current is not None else list(self._ciphers)[-1]
        if self.current not in self._ciphers:
            raise ValueError(
                f"saga_payload_key {self.current!r} is not among saga_payload_keys "
                f"({', '.join(self._ciphers)})"
            )

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def seal(self, data: bytes) -> tuple[str, bytes]:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self.current].encrypt(nonce, data, self.current.encode())
        return self.current, nonce + sealed

    def open(self, key_id: str, sealed: bytes) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadKeyError(
                key_id,
                f"a payload is sealed with key {key_id!r}, which this process does not hold "
                f"(its saga_payload_keys: {', '.join(self._ciphers)})",
            )
        try:
            return cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], key_id.encode())
        except self._refused:
            raise PayloadKeyError(
                key_id,
                f"a payload sealed with key {key_id!r} does not open with the key configured "
                "under that id (a different key was given that id, or the row was altered)",
            ) from None


def codec_from_conf(conf: Mapping[str, Any]) -> PayloadCodec | None:
    """The payload codec a Celery app's settings name: ``saga_payload_codec`` (a codec, or
    ``"module:attribute"`` naming one or a factory of one), else an ``AESGCMCodec`` over
    ``saga_payload_keys`` (``PayloadKeys``, or a plain mapping) and ``saga_payload_key``,
    else None (plain msgpack)."""
    named = conf.get("saga_payload_codec")
    keys = conf.get("saga_payload_keys")
    if isinstance(keys, PayloadKeys):
        keys = keys.material()
    if named is not None and keys:
        raise ValueError("set saga_payload_codec or saga_payload_keys, not both")
    if isinstance(named, str):
        named = _import(named)
    if named is not None:
        codec = named() if isinstance(named, type) or not hasattr(named, "seal") else named
        if not all(hasattr(codec, name) for name in ("seal", "open", "key_ids")):
            raise ValueError(f"saga_payload_codec {named!r} has no seal/open/key_ids")
        return codec  # type: ignore[no-any-return]
    if not keys:
        return None
    if not isinstance(keys, Mapping):
        raise ValueError("saga_payload_keys takes PayloadKeys (or a mapping) of key id to key")
    return AESGCMCodec(keys, conf.get("saga_payload_key"))


def _import(path: str) -> Any:
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"saga_payload_codec {path!r}: give it as 'module:attribute'")
    return getattr(importlib.import_module(module), attribute)


def _check_key_id(key_id: str) -> None:
    if not isinstance(key_id, str) or not key_id or len(key_id.encode()) > 64:
        raise ValueError(f"payload key id {key_id!r}: a non-empty string of at most 64 bytes")


def _key_bytes(key_id: str, key: bytes | str) -> bytes:
    if isinstance(key, str):
        try:
            key = base64.urlsafe_b64decode(key.encode() + b"=" * (-len(key) % 4))
        except (binascii.Error, ValueError):
            raise ValueError(f"payload key {key_id!r} is not URL-safe base64") from None
    if len(key) not in _KEY_BYTES:
        raise ValueError(
            f"payload key {key_id!r} is {len(key)} bytes; AES-GCM takes 16, 24 or 32 "
            "(make one with `celery saga db new-key`)"
        )
    return key
