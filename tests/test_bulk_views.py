"""Labels and many-runs moves in the views: ``show`` (text and JSON), the web view's run
page and its bulk page (a preview changes nothing; the move needs the form's CSRF token),
and the archive, which keeps a run's labels with it. SQLite, no worker: runs stay where
they start."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from celery_saga import Saga, SagaEngine
from celery_saga.cli import saga
from celery_saga.store.history import Kind
from celery_saga.store.tables import history, run_labels, run_labels_archive
from celery_saga.web import Credentials, WebSettings, create_app
from tests.conftest import unconsumed_app

AUTH = ("ops", "pw")


def _reserve(ctx: Any) -> None:
    return None


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[SagaEngine]:
    app = unconsumed_app("bulkviews")
    app.conf.update(saga_store_url=f"sqlite:///{tmp_path}/views.sqlite3")
    found = SagaEngine(app)
    found.register(Saga("shop").step("reserve", _reserve).wait_for("go"))
    found.ensure_schema()
    yield found
    found.db.dispose()


def _cli(engine: SagaEngine, *args: str) -> Any:
    obj = SimpleNamespace(app=engine.app)
    return CliRunner().invoke(saga, list(args), obj=obj, catch_exceptions=False)


def test_show_prints_a_runs_labels_in_text_and_json(engine: SagaEngine) -> None:
    run = engine.start("shop", {}, labels={"customer": "42", "region": "eu"}).id
    text = _cli(engine, "show", run).output
    assert "labels customer=42  region=eu" in text
    shown = json.loads(_cli(engine, "show", run, "--json").output)
    assert shown["labels"] == {"customer": "42", "region": "eu"}
    plain = engine.start("shop", {}).id
    assert "labels" not in _cli(engine, "show", plain).output
    assert engine.inspect().run(run).labels == (("customer", "42"), ("region", "eu"))


def test_the_archive_keeps_a_runs_labels_and_cleanup_deletes_them(engine: SagaEngine) -> None:
    from sqlalchemy import update

    from celery_saga.store.tables import executions

    archived, deleted = (engine.start("shop", {}, labels={"customer": c}).id for c in "ab")
    with engine.db.transaction() as connection:
        connection.execute(
            update(executions)
            .where(executions.c.id.in_([archived, deleted]))
            .values(state="completed")
        )
    engine.archive(0, actor="ops")
    assert engine.inspect().run(archived).labels == (("customer", "a"),)

    def count(table: Any) -> int:
        query = select(func.count().label("n")).select_from(table)
        return int(engine.db.read(query)[0]["n"])

    assert count(run_labels) == 0 and count(run_labels_archive) == 2


def _client(engine: SagaEngine, actions: bool = True) -> Any:
    settings = WebSettings(Credentials(*AUTH), actions=actions, secret="s")
    return create_app(engine, settings).test_client()


def test_the_web_run_page_shows_its_labels(engine: SagaEngine) -> None:
    run = engine.start("shop", {}, labels={"customer": "42"}).id
    page = _client(engine).get(f"/runs/{run}", auth=AUTH).get_data(as_text=True)
    assert "<code>customer=42</code>" in page


def _cancel_rows(engine: SagaEngine) -> list[Any]:
    query = select(history.c.execution_id, history.c.actor).where(
        history.c.kind == Kind.CANCELLED.value
    )
    return list(engine.db.read(query))


def test_the_web_bulk_page_previews_without_changing_and_moves_with_its_token(
    engine: SagaEngine,
) -> None:
    chosen = [engine.start("shop", {}, labels={"customer": "42"}).id for _ in range(4)]
    other = engine.start("shop", {}, labels={"customer": "7"}).id
    client = _client(engine)
    preview = client.get(
        "/bulk", query_string={"move": "cancel", "where": "label.customer=42"}, auth=AUTH
    ).get_data(as_text=True)
    assert "<b>4</b> run(s) match" in preview
    assert all(run in preview for run in chosen) and other not in preview
    assert _cancel_rows(engine) == []
    refused = client.post(
        "/bulk/cancel", data={"where": "label.customer=42", "csrf_token": "x"}, auth=AUTH
    )
    assert refused.status_code == 403 and _cancel_rows(engine) == []
    token = re.search(r'name="csrf_token" value="([^"]+)"', preview)
    assert token is not None
    # The token is for the terms it was shown with: it moves no other runs.
    elsewhere = client.post(
        "/bulk/cancel", data={"where": "label.customer=7", "csrf_token": token.group(1)}, auth=AUTH
    )
    assert elsewhere.status_code == 403 and _cancel_rows(engine) == []
    done = client.post(
        "/bulk/cancel",
        data={"where": "label.customer=42", "csrf_token": token.group(1)},
        auth=AUTH,
    ).get_data(as_text=True)
    assert "4 run(s) acted on" in done
    rows = _cancel_rows(engine)
    assert sorted(r["execution_id"] for r in rows) == sorted(chosen)
    assert all(re.fullmatch(r"web:ops \(bulk bulk-\w+\)", r["actor"]) for r in rows)


def test_a_bad_term_on_the_web_bulk_page_is_named_and_nothing_changes(
    engine: SagaEngine,
) -> None:
    engine.start("shop", {}, labels={"customer": "42"})
    page = _client(engine).get(
        "/bulk", query_string={"move": "cancel", "where": "colour=blue"}, auth=AUTH
    )
    assert "unknown key &#39;colour&#39;" in page.get_data(as_text=True)
    assert _cancel_rows(engine) == []


def test_a_bulk_move_without_a_term_is_refused(engine: SagaEngine) -> None:
    with pytest.raises(Exception, match="at least one --where term"):
        engine.bulk("cancel", [])
    result = _cli(engine, "cancel")
    assert result.exit_code != 0 and "give an EXECUTION_ID, or --where" in result.output


def test_a_bulk_move_keeps_to_its_rate(engine: SagaEngine) -> None:
    import time

    for _ in range(12):
        engine.start("shop", {}, labels={"customer": "42"})
    began = time.monotonic()
    done = engine.bulk("cancel", ["label.customer=42"], rate=10.0)
    took = time.monotonic() - began
    assert done.acted == 12
    # The 12th move is due 1.1 s after the first: at most 10 a second.
    assert 1.1 <= took < 3.0, took
    with pytest.raises(Exception, match="rate is a number of runs per second > 0"):
        engine.bulk("cancel", ["label.customer=42"], rate=0)


def test_a_bulk_flag_on_one_run_is_refused_not_ignored(engine: SagaEngine) -> None:
    run = engine.start("shop", {}).id
    result = _cli(engine, "cancel", run, "--rate", "5/s")
    assert result.exit_code != 0 and "goes with --where" in result.output, result.output
    # --dry-run is the one-run command's own: it prints that run's plan.
    planned = _cli(engine, "cancel", run, "--dry-run")
    assert planned.exit_code == 0 and "plan" in planned.output, planned.output
    both = _cli(engine, "cancel", "--where", "saga=shop", "--resume", "bulk-x", "--yes")
    assert both.exit_code != 0 and "--resume carries on an operation" in both.output
    assert engine.get(run).state.value == "running"
    assert _cancel_rows(engine) == []


def _ship(ctx: Any) -> None:
    return None


def test_a_bulk_upgrade_moves_the_selected_runs_to_the_newest_version(
    engine: SagaEngine,
) -> None:
    old = [engine.start("shop", {}, labels={"batch": "b"}).id for _ in range(3)]
    other = engine.start("shop", {}).id
    engine.register(Saga("shop").step("reserve", _reserve).wait_for("go").step("ship", _ship))
    newest = engine.definition("shop").hash
    shown = _cli(engine, "upgrade", "--where", "label.batch=b", "--dry-run")
    assert "3 run(s) match" in shown.output
    done = _cli(engine, "upgrade", "--where", "label.batch=b", "--yes")
    assert "3 acted on, 0 refused" in done.output, done.output
    assert [engine.get(run).record.definition_hash for run in old] == [newest] * 3
    assert engine.get(other).record.definition_hash != newest
    upgraded = engine.db.read(
        select(history.c.actor).where(history.c.execution_id.in_(old), history.c.kind == "upgraded")
    )
    assert len(upgraded) == 3 and all("(bulk bulk-" in row["actor"] for row in upgraded)


def test_a_bulk_resolve_takes_its_step_and_note_from_the_command(engine: SagaEngine) -> None:
    engine.start("shop", {}, labels={"batch": "b"})
    args = ["resolve", "--where", "label.batch=b", "--step", "reserve", "--note", "by hand"]
    shown = _cli(engine, *args, "--dry-run")
    assert shown.exit_code == 0 and "0 run(s) match" in shown.output, shown.output
    done = _cli(engine, *args, "--yes")
    assert "0 acted on, 0 refused" in done.output, done.output
