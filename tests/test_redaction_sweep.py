"""No marked value anywhere a person can read it: a saga marking fields, with a sub-saga
marking more, run on PostgreSQL without the payload codec, then read through every page of
the web view, every page of the Django admin (and lookups crafted on its payload columns),
``saga show``, ``show --json``, ``list --json``, the logs and every text column; with the
codec, the values are in no column at all."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from celery_saga import ExecutionState
from celery_saga.cli import saga as saga_cli
from celery_saga.encryption import new_key
from celery_saga.runtime.clock import get_clock
from celery_saga.store import retention
from celery_saga.store.codec import use_codec
from celery_saga.store.tables import metadata as saga_metadata
from celery_saga.web import Credentials, WebSettings, create_app
from tests import redaction_family as family
from tests.conftest import fresh_pg_database, in_process_pg_engine
from tests.django_probe import run_probe

AUTH = ("ops", "pw")
ORDERS = {"failed": 6101, "done": 6102}


def _secrets() -> list[str]:
    return [secret for order in ORDERS.values() for secret in family.secrets_of(order)]


def _columns(engine: Any) -> list[Any]:
    """Every value of every saga table, archive tables included."""
    values = []
    for table in saga_metadata.sorted_tables:
        for row in engine.db.read(select(table)):
            values.extend(row.values())
    return values


def _run_family(engine: Any) -> dict[str, Any]:
    runs = {}
    for label, order in ORDERS.items():
        data = family.family_input(order, fail=label == "failed")
        runs[label] = engine.start(family.PARENT, data).wait(60)
    assert runs["failed"].state is ExecutionState.FAILED, runs["failed"].failure_reason
    assert runs["done"].state is ExecutionState.COMPLETED, runs["done"].failure_reason
    return runs


def _cli(engine: Any, *args: str) -> str:
    obj = SimpleNamespace(app=engine.app)
    result = CliRunner().invoke(saga_cli, list(args), obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _read(engine: Any, ids: list[str], archived: bool) -> dict[str, str]:
    """Every page of the web view and every ``show`` and ``list`` of the runs ``ids``."""
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    listing = "/?archived=1" if archived else "/"
    urls = [listing, *(f"{listing}{'&' if archived else '?'}text={s}" for s in _secrets())]
    urls += [f"/runs/{run_id}" for run_id in ids]
    pages = {url: client.get(url, auth=AUTH) for url in urls}
    assert all(reply.status_code == 200 for reply in pages.values()), pages
    texts = {url: reply.get_data(as_text=True) for url, reply in pages.items()}
    for run_id in ids:
        texts[f"show {run_id}"] = _cli(engine, "show", run_id)
        texts[f"show --json {run_id}"] = _cli(engine, "show", run_id, "--json")
    listed = ["list", "--json", "--limit", "100", *(["--archived"] if archived else [])]
    texts[" ".join(listed)] = _cli(engine, *listed)
    return {f"{'archived ' if archived else ''}{where}": t for where, t in texts.items()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The family run once; everything a person may read of it, live and once archived;
    the Django admin's pages of it (read while it is live)."""
    store = fresh_pg_database("sweep")
    logged = _Collect()
    try:
        with in_process_pg_engine("sweep", *family.define(), store_url=store) as engine:
            # after the worker's start: Celery's logging set-up replaces the root's handlers
            logging.getLogger().addHandler(logged)
            runs = _run_family(engine)
            ids = [row.id for row in engine.list(limit=100).items]
            assert len(ids) == 4, ids  # two parents, two children
            texts = _read(engine, ids, archived=False)
            admin = _admin(store, tmp_path_factory.mktemp("sweep-admin"))
            now = get_clock().now()
            assert retention.retire(engine.db, cutoff=now, now=now, archive=True, rest=0) == 4
            texts.update(_read(engine, ids, archived=True))
            columns = _columns(engine)
    finally:
        logging.getLogger().removeHandler(logged)
    texts["logs"] = "\n".join(logged.lines)
    yield SimpleNamespace(runs=runs, ids=ids, texts=texts, columns=columns, admin=admin)


class _Collect(logging.Handler):
    """Every record logged in this process while the family runs, formatted with its
    traceback (as a log file would hold it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _found(texts: dict[str, str]) -> list[tuple[str, str]]:
    return [(where, s) for where, text in texts.items() for s in _secrets() if s in text]


def test_no_marked_value_in_the_web_view_show_list_or_logs(swept: SimpleNamespace) -> None:
    # a search page shows its own query back: what it must not do is list a run for it
    assert _found({k: v for k, v in swept.texts.items() if "text=" not in k}) == []
    assert "[redacted]" in swept.texts[f"/runs/{swept.runs['done'].id}"]
    assert "[redacted]" in swept.texts[f"archived /runs/{swept.runs['done'].id}"]
    assert "report refused card [redacted]" in swept.texts["logs"], "the failure was logged"
    # the search by a marked value finds no run: it would confirm a guess
    for secret in _secrets():
        assert not [i for i in swept.ids if i in swept.texts[f"/?text={secret}"]], secret
        searched = swept.texts[f"archived /?archived=1&text={secret}"]
        assert not [i for i in swept.ids if i in searched], secret


def test_no_marked_value_in_any_text_column(swept: SimpleNamespace) -> None:
    texts = [value for value in swept.columns if isinstance(value, str)]
    assert [s for s in _secrets() if any(s in text for text in texts)] == []
    assert any("report refused card [redacted]" in text for text in texts)


def _admin(store: str, tmp: Any) -> dict[str, Any]:
    """The Django admin's pages (tests/djangosite/sweep_probe.py) and crafted lookups: a
    guess as PostgreSQL's LIKE reads a bytea (its hex text), and as it was typed."""
    done = ORDERS["done"]
    guesses = [family.card_of(done).encode().hex(), family.card_of(done)]
    guesses += [family.pin_of(done).encode().hex()]
    return run_probe(
        "sweep_probe.py",
        store,
        "sweep",
        SHOP_DJANGO_DB=str(tmp / "django.sqlite3"),
        SWEEP_GUESSES=json.dumps(guesses),
    )


def test_no_marked_value_on_any_page_of_the_django_admin(swept: SimpleNamespace) -> None:
    admin = swept.admin
    pages = {url: body for url, status, body in admin["pages"] if status == 200}
    assert len(pages) == len(admin["pages"]), [p[:2] for p in admin["pages"] if p[1] != 200]
    assert len(pages) > 3 + len(swept.ids)  # the lists, each run, each step, each row
    assert _found(pages) == []
    assert any("[redacted]" in body for body in pages.values())


def test_no_lookup_crafted_on_a_payload_column_tells_a_guess_from_a_miss(
    swept: SimpleNamespace,
) -> None:
    lookups = swept.admin["lookups"]
    told = [url for url, _, body in lookups if any(i in body for i in swept.ids)]
    assert told == []


def test_with_the_codec_no_marked_value_is_in_any_column() -> None:
    store = fresh_pg_database("sweep_sealed")
    keys = {"k1": new_key()}
    try:
        with in_process_pg_engine(
            "sweep-sealed", *family.define(), store_url=store, saga_payload_keys=keys
        ) as engine:
            _run_family(engine)
            values = _columns(engine)
    finally:
        use_codec(None)  # the codec is the process's: leave none behind
    assert len(values) > 50
    for secret in _secrets():
        encoded = secret.encode()
        assert not [v for v in values if isinstance(v, str) and secret in v], secret
        assert not [v for v in values if isinstance(v, (bytes, memoryview)) and encoded in bytes(v)]
