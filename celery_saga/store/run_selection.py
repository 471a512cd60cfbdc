"""The runs a ``RunFilter`` selects, a page at a time: one query builder, keyset-paginated
(never OFFSET), each page starting where the last one stopped on an index.

With a label term the page walks ``ix_saga_run_labels_key_value`` (key, value, execution
id) from the last id; without one it walks runs in listing order (created_at, id) on the
index of the saga or state named, or on the listing index. Every other term is checked on
the rows the index yields. ``benchmarks/run_selection.py`` EXPLAINs it on a filled store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, or_, select

from celery_saga.records import StepStatus
from celery_saga.run_filter import RunFilter
from celery_saga.store.database import Database, from_db_time, to_db_time
from celery_saga.store.queries import keyset_after
from celery_saga.store.tables import executions, run_labels, step_records, version_shapes

#: The step statuses of a run's current or failed step.
_OPEN_STEP = (StepStatus.PENDING.value, StepStatus.RUNNING.value, StepStatus.FAILED.value)


@dataclass(frozen=True)
class SelectedPage:
    """The ids of one page, in page order, and where the next page starts (None: none)."""

    ids: tuple[str, ...]
    cursor: str | None


def _label(key: str, value: str) -> Any:
    # An alias: a page driven by one label has ``run_labels`` in its FROM already.
    other = run_labels.alias("other_label")
    return exists().where(
        other.c.execution_id == executions.c.id, other.c.key == key, other.c.value == value
    )


def _contains(column: Any, text: str) -> Any:
    return func.lower(column).contains(text.lower(), autoescape=True)


def _conditions(run_filter: RunFilter, now: datetime) -> list[Any]:
    """Every term but the label that drives a label-ordered page."""
    found: list[Any] = []
    if run_filter.sagas:
        found.append(executions.c.saga_name.in_(run_filter.sagas))
    if run_filter.states:
        found.append(executions.c.state.in_([s.value for s in run_filter.states]))
    if run_filter.versions:
        found.append(or_(*(_version(v) for v in run_filter.versions)))
    for name in run_filter.steps:
        found.append(
            exists().where(
                step_records.c.execution_id == executions.c.id,
                step_records.c.name == name,
                step_records.c.status.in_(_OPEN_STEP),
            )
        )
    for text in run_filter.errors:
        step_error = exists().where(
            step_records.c.execution_id == executions.c.id, _contains(step_records.c.error, text)
        )
        found.append(
            or_(
                _contains(executions.c.failure_reason, text),
                _contains(executions.c.rollback_reason, text),
                step_error,
            )
        )
    if run_filter.older_than is not None:
        found.append(executions.c.created_at < to_db_time(now - run_filter.older_than))
    return found


def _version(value: str) -> Any:
    """A version as an operator names it: its hash, the hash's first characters, or its
    label (``saga_version_shapes`` knows each label's hash)."""
    labelled = select(version_shapes.c.definition_hash).where(version_shapes.c.label == value)
    return or_(
        executions.c.definition_hash == value,
        executions.c.definition_hash.startswith(value, autoescape=True),
        executions.c.definition_hash.in_(labelled),
    )


def page_query(run_filter: RunFilter, *, now: datetime, after: str | None, limit: int) -> Any:
    """The SELECT of the next ``limit`` runs after cursor ``after`` (its columns: ``id``,
    and ``created_at`` unless a label drives the page)."""
    conditions = _conditions(run_filter, now)
    if run_filter.labels:
        (key, value), *others = run_filter.labels
        conditions += [_label(k, v) for k, v in others]
        if after is not None:
            conditions.append(run_labels.c.execution_id > _decode(after)[1])
        return (
            select(run_labels.c.execution_id.label("id"))
            .join(executions, executions.c.id == run_labels.c.execution_id)
            .where(run_labels.c.key == key, run_labels.c.value == value, *conditions)
            .order_by(run_labels.c.execution_id)
            .limit(limit)
        )
    if after is not None:
        stamp, last = _decode(after)
        if stamp is not None:
            conditions.append(keyset_after(executions.c.created_at, (to_db_time(stamp), last)))
    return (
        select(executions.c.id, executions.c.created_at)
        .where(*conditions)
        .order_by(executions.c.created_at, executions.c.id)
        .limit(limit)
    )


def select_page(
    db: Database, run_filter: RunFilter, *, now: datetime, after: str | None, limit: int
) -> SelectedPage:
    """The next ``limit`` runs ``run_filter`` selects after cursor ``after``."""
    query = page_query(run_filter, now=now, after=after, limit=limit)
    rows: Sequence[Any] = db.read(query, in_order=True)
    ids = tuple(row["id"] for row in rows)
    if len(rows) < limit:
        return SelectedPage(ids, None)
    last = rows[-1]
    stamp = None if run_filter.labels else from_db_time(last["created_at"])
    return SelectedPage(ids, _encode(stamp, last["id"]))


def count(db: Database, run_filter: RunFilter, *, now: datetime) -> int:
    """How many runs ``run_filter`` selects now: its pages' query without order or limit
    (a label's count reads that label's index entries, not every run)."""
    selected = page_query(run_filter, now=now, after=None, limit=1).order_by(None).limit(None)
    query = select(func.count().label("n")).select_from(selected.subquery())
    return int(db.read(query)[0]["n"])


def _encode(stamp: datetime | None, execution_id: str) -> str:
    return f"{'' if stamp is None else stamp.isoformat()}|{execution_id}"


def _decode(cursor: str) -> tuple[datetime | None, str]:
    stamp, _, execution_id = cursor.partition("|")
    return (datetime.fromisoformat(stamp) if stamp else None), execution_id
