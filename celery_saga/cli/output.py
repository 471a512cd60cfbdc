"""How commands print: JSON that never fails on stored values, and plain aligned tables."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def as_json(value: Any) -> str:
    """Stored payloads may hold datetimes, decimals, bytes: each gets a readable form."""
    return json.dumps(value, default=_plain, indent=2, sort_keys=False)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], widest: int = 60) -> list[str]:
    """Left-aligned columns, each as wide as its widest cell (cut at ``widest``)."""
    cells = [[c if len(c) <= widest else c[: widest - 1] + "…" for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return lines
