"""The runs page's query: filters and order from the URL's arguments, the page read through
the read API (``Inspector.runs``, as ``celery saga list``), and the text search over it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_saga.definition.run_markings import FindDefinition, run_markings
from celery_saga.durations import parse_duration
from celery_saga.errors import SagaError
from celery_saga.inspect import Filters
from celery_saga.inspect.jsonable import as_json
from celery_saga.records import ExecutionRecord, ExecutionState
from celery_saga.redaction import redact

#: The orders the run list offers -> newest first? Both read an index in its order (O(page)).
SORTS = {"newest": True, "oldest": False}


@dataclass(frozen=True)
class ListQuery:
    """What the operator typed into the filter form; empty strings mean "any"."""

    saga: str = ""
    state: str = ""
    version: str = ""
    older_than: str = ""
    newer_than: str = ""
    text: str = ""
    cursor: str = ""
    #: "1": the archived runs instead of the live ones.
    archived: str = ""
    #: A key of ``SORTS``; empty: the first.
    sort: str = ""

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> ListQuery:
        fields = ListQuery.__dataclass_fields__
        return cls(**{name: str(args.get(name, "")).strip() for name in fields})

    @property
    def newest_first(self) -> bool:
        """The order asked for; raises ``SagaError`` for one it does not offer."""
        if self.sort and self.sort not in SORTS:
            raise SagaError(f"{self.sort!r} is not a sort: {' or '.join(SORTS)}")
        return SORTS.get(self.sort, True)

    def with_cursor(self, cursor: str) -> dict[str, str]:
        """The URL arguments of the next page."""
        kept = {k: v for k, v in self.__dict__.items() if v and k != "cursor"}
        return {**kept, "cursor": cursor}


def filters_of(query: ListQuery, now: datetime, hashes: Sequence[str]) -> Filters:
    """The store's filters for ``query`` (``hashes``: what its version named); raises
    ``SagaError`` for a state or an age it cannot read."""
    states: list[ExecutionState] = []
    if query.state:
        try:
            states = [ExecutionState(query.state)]
        except ValueError:
            raise SagaError(f"{query.state!r} is not a state") from None
    return Filters(
        saga_names=[query.saga] if query.saga else [],
        states=states,
        created_before=now - parse_duration(query.older_than) if query.older_than else None,
        created_after=now - parse_duration(query.newer_than) if query.newer_than else None,
        definition_hashes=hashes,
    )


def shown_input(record: ExecutionRecord, find: FindDefinition) -> Any:
    """The run's input as an operator may see it: what its saga marks sensitive redacted
    (all of it when this process does not have its saga)."""
    marks = run_markings(find, record.saga_name, record.definition_hash)
    return redact(record.input, ("input",), marks)


def matches_text(record: ExecutionRecord, text: str, find: FindDefinition) -> bool:
    """``text`` in the run's id or in its redacted input (never in what the saga marks
    sensitive: a search would tell those values one guess at a time)."""
    if not text:
        return True
    needle = text.lower()
    if needle in record.id.lower():
        return True
    return needle in as_json(shown_input(record, find)).lower()
