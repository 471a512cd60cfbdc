"""What operators see of flow control (guarantee 37), on a SQLite store with no worker, so
the runs beyond the limit stay queued: ``show`` says which key a run queues behind and how
many are ahead, ``list`` and the web view say it alike, ``limits`` lists the busiest keys,
the gauges count the queue and its longest wait per saga."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_saga import ExecutionState, Limit, Saga, SagaEngine
from celery_saga.cli import saga
from celery_saga.gauges import StoreGauges
from celery_saga.web import Credentials, WebSettings, create_app
from tests.conftest import unconsumed_app

AUTH = ("ops", "pw")


def _pay(ctx: Any) -> None:
    return None


@pytest.fixture
def queued(tmp_path: Path) -> SimpleNamespace:
    """Three runs of customer c (one live, two queued) and one of customer d."""
    app = unconsumed_app("flow-ops")
    app.conf.update(saga_store_url=f"sqlite:///{tmp_path}/flow.sqlite3")
    engine = SagaEngine(app)
    name = f"orders{uuid.uuid4().hex[:6]}"
    limit = Limit(key=lambda i: i["customer"], max=1)
    engine.register(Saga(name, concurrency=limit).step("pay", _pay))
    c = [engine.start(name, {"customer": "c"}).id for _ in range(3)]
    d = engine.start(name, {"customer": "d"}).id
    return SimpleNamespace(app=app, engine=engine, saga=name, c=c, d=d)


def _cli(world: SimpleNamespace, *args: str) -> str:
    result = CliRunner().invoke(saga, list(args), obj=SimpleNamespace(app=world.app))
    assert result.exit_code == 0, result.output
    return result.output


def test_show_says_which_key_a_run_queues_behind_and_how_many_are_ahead(
    queued: SimpleNamespace,
) -> None:
    shown = json.loads(_cli(queued, "show", queued.c[2], "--json"))
    assert shown["state"] == "queued"
    assert shown["waiting"] == "queued behind key 'c', 1 ahead"
    assert "queued behind key 'c', 1 ahead" in _cli(queued, "show", queued.c[2])
    assert json.loads(_cli(queued, "show", queued.c[0], "--json"))["waiting"] is None


def test_list_shows_the_queued_runs_and_their_key(queued: SimpleNamespace) -> None:
    listed = json.loads(_cli(queued, "list", "--state", "queued", "--json"))["items"]
    assert [item["id"] for item in listed] == queued.c[1:]
    printed = [line for line in _cli(queued, "list", "--state", "queued").splitlines()[1:]]
    assert len(printed) == 2 and all(line.endswith("queued behind key 'c'") for line in printed)


def test_limits_lists_the_busiest_keys_with_live_and_queued_runs(queued: SimpleNamespace) -> None:
    items = json.loads(_cli(queued, "limits", "--json"))["items"]
    ours = [
        (i["key"], i["live"], i["limit"], i["queued"]) for i in items if i["saga"] == queued.saga
    ]
    assert ours == [("c", 1, 1, 2), ("d", 1, 1, 0)]
    printed = _cli(queued, "limits").splitlines()
    assert printed[0].split() == ["SAGA", "KEY", "LIVE", "QUEUED", "OLDEST", "WAIT"]
    assert printed[1].split()[:4] == [queued.saga, "c", "1/1", "2"]


def test_the_gauges_count_the_queue_and_its_longest_wait_per_saga(queued: SimpleNamespace) -> None:
    gauges = StoreGauges(queued.engine.db)
    gauges.refresh()
    assert gauges.reading.runs[queued.saga, "queued"] == 2
    assert queued.saga in gauges.reading.oldest_queued
    families = {family.name: family for family in gauges.collect()}
    waited = families["saga_oldest_queued_run_age_seconds"].samples
    assert [s.labels for s in waited] == [{"saga": queued.saga}], "labelled by saga, not by key"


def test_the_web_view_says_it_as_show_does(queued: SimpleNamespace) -> None:
    client = create_app(queued.engine, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{queued.c[1]}", auth=AUTH).get_data(as_text=True)
    assert "queued behind key &#39;c&#39;, 0 ahead" in page


def test_a_queued_run_past_its_deadline_is_cancelled_without_starting(tmp_path: Path) -> None:
    app = unconsumed_app("flow-deadline")
    app.conf.update(saga_store_url=f"sqlite:///{tmp_path}/deadline.sqlite3")
    engine = SagaEngine(app)
    limit = Limit(key=lambda i: i["customer"], max=1)
    engine.register(Saga("late", concurrency=limit).step("pay", _pay))
    first = engine.start("late", {"customer": "c"}).id
    second = engine.start("late", {"customer": "c"}, timeout=0.2).id
    time.sleep(0.3)
    assert engine.executor.cancel_overdue() == 1
    queued = engine.get(second)
    assert queued.state is ExecutionState.CANCELLED
    assert queued.failure_reason == "CancelledError: deadline"
    assert queued.steps == (), "it never started"
    assert engine.get(first).state is ExecutionState.RUNNING, "its slot was not touched"
