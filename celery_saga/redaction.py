"""Redaction: pure functions from a run's data and its saga's markings
(``definition/sensitivity.py``) to what a human may be shown.

``redact`` replaces marked values in structured data; ``secrets_in`` collects the text forms
of marked values, so free text that may embed them (an exception's message, a traceback) is
``scrub``-bed of them. Neither reads or writes anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from celery_saga.definition.sensitivity import DataPath, Sensitivity

#: What a marked value is shown as.
REDACTED = "[redacted]"
#: What every payload value of a run is shown as when this process lacks its saga: its
#: markings are unknown here, so nothing of it may be taken for unmarked.
NOT_REGISTERED = "[redacted: saga not registered here]"
#: Shorter text forms are not scrubbed from free text: "1", "EUR" or "true" would turn
#: every number and word of a message into ``[redacted]`` while hiding nothing.
MIN_SECRET_LENGTH = 4


def _key(key: Any) -> str | int:
    return key if isinstance(key, (str, int)) and not isinstance(key, bool) else str(key)


def redact(value: Any, path: DataPath, marks: Sensitivity) -> Any:
    """``value`` (found at ``path``) with every marked part replaced by ``REDACTED`` (by
    ``NOT_REGISTERED`` where its saga's markings are unknown); dicts, lists and tuples are
    copied, anything unmarked is returned as it is."""
    if marks.empty:
        return value
    if marks.marked(path, value):
        return NOT_REGISTERED if marks.unknown(path) else REDACTED
    if isinstance(value, Mapping):
        return {key: redact(item, (*path, _key(key)), marks) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [redact(item, (*path, index), marks) for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return value


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _text_forms(leaf: Any) -> set[str]:
    """How a leaf may appear in a message: as ``str`` gives it, and escaped as ``repr``
    gives it inside a container (quotes, backslashes, non-ASCII)."""
    if isinstance(leaf, bool) or not isinstance(leaf, (str, int, float, bytes)):
        return set()
    if isinstance(leaf, bytes):
        forms = {repr(leaf)[2:-1]}
    else:
        forms = {str(leaf)}
        if isinstance(leaf, str):
            forms.add(repr(leaf)[1:-1])
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def secrets_in(value: Any, path: DataPath, marks: Sensitivity) -> frozenset[str]:
    """The text forms of every marked leaf in ``value`` (found at ``path``): strings and
    numbers whose text is at least ``MIN_SECRET_LENGTH`` characters."""
    if marks.empty:
        return frozenset()
    found: set[str] = set()
    _collect(value, path, marks, found)
    return frozenset(found)


def _collect(value: Any, path: DataPath, marks: Sensitivity, found: set[str]) -> None:
    if marks.marked(path, value):
        for leaf in _leaves(value):
            found.update(_text_forms(leaf))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _collect(item, (*path, _key(key)), marks, found)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _collect(item, (*path, index), marks, found)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``REDACTED`` (the longest
    first, so a secret containing another is replaced whole)."""
    ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not ordered or not text:
        return text
    return re.sub("|".join(map(re.escape, ordered)), REDACTED, text)


def run_secrets(
    marks: Sensitivity,
    input: Any,
    results: Mapping[str, Any],
    signals: Mapping[str, Any],
) -> frozenset[str]:
    """Every marked value of a run, as text: its input, step results and signal payloads."""
    if marks.empty:
        return frozenset()
    found = set(secrets_in(input, ("input",), marks))
    for name, result in results.items():
        found |= secrets_in(result, ("results", name), marks)
    for event, payload in signals.items():
        found |= secrets_in(payload, ("signals", event), marks)
    return frozenset(found)
