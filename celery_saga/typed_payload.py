"""A signal's payload as an operator types it (``saga signal --payload``, the web view's
signal form): JSON, nested no deeper than ``MAX_DEPTH``. Deeper JSON would raise a
``RecursionError`` in the parser, or later in the store's encoder and the redaction, which
walk a payload recursively; no payload a saga reads is nested that deep."""

from __future__ import annotations

import json
from typing import Any

from celery_saga.errors import SagaError

#: Lists and mappings inside one another, at most.
MAX_DEPTH = 100


def _depth_over(value: Any, most: int) -> bool:
    """Whether ``value`` nests lists and mappings deeper than ``most`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > most:
                return True
            stack.extend((inner, depth + 1) for inner in item)
    return False


def parse_payload(text: str) -> Any:
    """The payload ``text`` holds; raises ``SagaError`` for text that is not JSON or that
    nests deeper than ``MAX_DEPTH``."""
    too_deep = SagaError(f"the payload is nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise SagaError(f"the payload is not valid JSON: {error}") from None
    except RecursionError:
        raise too_deep from None
    if _depth_over(value, MAX_DEPTH):
        raise too_deep
    return value
