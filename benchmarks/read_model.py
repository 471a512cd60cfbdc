"""How long the read API and its views take on big runs: ``celery saga show`` (text and
``--json``) and the web view's run page, for a run with 10,000 history rows (retried step
attempts, each with its start and end) and a ``for_each`` of 1,000 items.

    python benchmarks/read_model.py [--store sqlite:///read.sqlite3] [--items 1000]

Each view is timed ``--rounds`` times in this process (the first one warms the caches);
the script prints the median and the slowest, in seconds. The runs are made once, by an
embedded worker on the memory broker; the history rows are appended to the first run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from celery import Celery
from click.testing import CliRunner

from celery_saga import Saga, SagaEngine, get_clock, step
from celery_saga.cli import saga as saga_cli
from celery_saga.store import history
from celery_saga.store.history import HistoryEntry
from celery_saga.web import Credentials, WebSettings, create_app
from celery_saga.worker.embedded import embedded_worker

AUTH = ("ops", "pw")


def _step(ctx: Any) -> None:
    return None


def _runs(engine: SagaEngine, app: Celery, items: int, rows: int) -> tuple[str, str]:
    engine.register(
        Saga("busy").step("a", _step).step("b", _step),
        Saga("wide").for_each(lambda ctx: list(range(ctx.input["n"])), step("item", _step)),
    )
    with embedded_worker(app):
        busy = engine.start("busy", {})
        busy.wait(60)
        wide = engine.start("wide", {"n": items})
        wide.wait(600)
    start = get_clock().now()
    for row in range(rows):
        at = start + timedelta(milliseconds=row)
        entry = HistoryEntry(
            at + timedelta(milliseconds=1),
            "step-retrying",
            step="a",
            attempt=row + 1,
            holder="bench/1/task",
            detail="ConnectionError: retry",
            started_at=at,
        )
        history.append(engine.db, busy.id, entry)
    return str(busy.id), str(wide.id)


def _timed(rounds: int, call: Callable[[], object]) -> tuple[float, float]:
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        took.append(time.perf_counter() - began)
    return statistics.median(took[1:] or took), max(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    store = args.store or f"sqlite:///{Path(tempfile.mkdtemp()) / 'read.sqlite3'}"
    app = Celery("read-bench", broker="memory://localhost/")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    engine = SagaEngine(app, store_url=store)
    engine.ensure_schema()
    busy, wide = _runs(engine, app, args.items, args.rows)
    obj = SimpleNamespace(app=app)
    client = create_app(engine, WebSettings(Credentials(*AUTH))).test_client()
    for label, run_id in ((f"{args.rows} history rows", busy), (f"for_each of {args.items}", wide)):
        views: dict[str, Callable[[], object]] = {
            "read API": lambda run_id=run_id: engine.inspect().run(run_id),
            "show": lambda run_id=run_id: CliRunner().invoke(saga_cli, ["show", run_id], obj=obj),
            "show --json": lambda run_id=run_id: CliRunner().invoke(
                saga_cli, ["show", run_id, "--json"], obj=obj
            ),
            "web page": lambda run_id=run_id: client.get(f"/runs/{run_id}", auth=AUTH),
        }
        for view, call in views.items():
            median, slowest = _timed(args.rounds, call)
            print(f"{label:<24} {view:<12} median {median:6.3f} s  slowest {slowest:6.3f} s")


if __name__ == "__main__":
    main()
