"""The Django admin's unmanaged models describe the store's tables as they are: the same
columns, types, lengths and nullability as ``store/tables.py`` (the schema the store's own
migrations make), and Django's migrations of the app hold every field of its models.

The models are a third description of the tables (after the SQLAlchemy tables and the
Alembic migrations); nothing else would notice when a store migration adds a column and the
models miss it, or a model gains a field its migrations never recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
)

from celery_saga.store.tables import executions, history, paused_runs, pauses, step_records
from tests.conftest import ROOT

#: The tables the admin shows, each by one model.
MODELLED = (executions, step_records, history, pauses, paused_runs)

#: SQLAlchemy type -> the Django field type that reads it (subclasses first).
KINDS = (
    (BigInteger, "BigIntegerField"),
    (Integer, "IntegerField"),
    (Text, "TextField"),
    (String, "CharField"),
    (LargeBinary, "BinaryField"),
    (DateTime, "DateTimeField"),
    (Boolean, "BooleanField"),
)


def _column(column: Column[Any]) -> dict[str, Any]:
    kind = next(name for sql_type, name in KINDS if isinstance(column.type, sql_type))
    length = column.type.length if kind == "CharField" else None  # type: ignore[attr-defined]
    return {"kind": kind, "nullable": bool(column.nullable), "length": length}


def _table(table: Table) -> dict[str, dict[str, Any]]:
    return {column.name: _column(column) for column in table.columns}


@pytest.fixture(scope="module")
def django_side() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "django_columns.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def test_each_admin_model_has_exactly_the_columns_of_its_store_table(
    django_side: dict[str, Any],
) -> None:
    models = django_side["tables"]
    assert sorted(models) == sorted(t.name for t in MODELLED)
    for table in MODELLED:
        store, model = _table(table), models[table.name]
        assert sorted(set(store) - set(model)) == [], f"{table.name}: missing in the model"
        assert sorted(set(model) - set(store)) == [], f"{table.name}: not in the store"
        differing = {
            name: (store[name], model[name]) for name in store if store[name] != model[name]
        }
        assert differing == {}, f"{table.name}: (store, model) differ"


def test_django_migrations_hold_every_field_of_the_models(django_side: dict[str, Any]) -> None:
    """A field in a model that the app's migrations never added (``HistoryRow.started_at``
    was one): ``makemigrations --check`` tracks no field of an unmanaged model, so this
    compares the migrations' state with the models."""
    assert django_side["migrated"] == django_side["tables"]
