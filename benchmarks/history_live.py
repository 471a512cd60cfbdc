"""Live five-step runs beside a retention catch-up (issue 26): their latency with and without it.

``beside(url, rate, seconds, catch_up)`` starts a ``celery worker`` of ``bench_app`` (prefork
2, prefetch 1, on RabbitMQ, as ``chain_vs_saga.py`` does) on the store at ``url``, and from a
thread of this process starts ``bench_five`` runs (five no-op steps) at a steady ``rate`` per
second: for ``seconds`` before the catch-up, for as long as ``catch_up()`` runs, and for
``seconds`` after it. A run's latency is its last write's ``updated_at`` less its
``created_at``, both stamped by the engine, so no poll of the driver adds to it. Runs are
started on a fixed schedule whatever came before (an open loop): a slow run does not delay
the next one, as a real client's would not.

The catch-up runs in this process, not in a worker slot: the stream measures what the
catch-up's transactions cost the live runs in the database (locks, I/O, CPU), not a pool
slot taken from them.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The runs of the first seconds (a fresh worker's connections and imports) are not counted.
WARM_UP = 3.0


def _configure(url: str) -> Any:
    """Import ``bench_app`` on the history store (its own database, schema public)."""
    loaded = sys.modules.get("bench_app")
    if loaded is not None:
        if url != loaded.BASE_STORE_URL:
            raise SystemExit("the live stream runs beside one store per process: the last N")
        return loaded
    os.environ["BENCH_BROKER_URL"] = os.environ.get(
        "BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//"
    )
    os.environ["BENCH_STORE_URL"] = url
    os.environ["BENCH_SCHEMA"] = "public"
    os.environ["BENCH_QUEUE"] = f"celery_saga_bench_history_{uuid.uuid4().hex[:6]}"
    os.environ["BENCH_PROFILE"] = "0"
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import bench_app

    return bench_app


def _stream(bench: Any, rate: float, stop: threading.Event, started: list[str]) -> None:
    """Start runs every ``1 / rate`` s until ``stop``, their ids (the engine's own) into
    ``started``: the live runs take new ids the way a deployment's do."""
    began = time.monotonic()
    while not stop.is_set():
        started.append(bench.engine.start(bench.SAGA_NAME, {}).id)
        delay = began + len(started) / rate - time.monotonic()
        if delay > 0:
            stop.wait(delay)


@contextmanager
def _streaming(bench: Any, rate: float) -> Iterator[list[str]]:
    """Runs started at ``rate`` while the block runs; the list holds their ids."""
    stop, started, failed = threading.Event(), [], []

    def stream() -> None:
        try:
            _stream(bench, rate, stop, started)
        except BaseException as error:  # reported below: a phase never measures a dead stream
            failed.append(error)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        yield started
    finally:
        stop.set()
        thread.join()
    if failed:
        raise SystemExit(f"the live stream stopped: {failed[0]!r}")


def _latencies(bench: Any, label: str, ids: list[str], timeout: float = 120.0) -> list[float]:
    """End-to-end milliseconds of the runs ``ids``, in the order started, once all completed."""
    from bench_infra import rows, scalar, wait_until

    settled = (
        "SELECT count(*) FROM saga_executions WHERE id = ANY(:ids) "
        "AND state IN ('completed', 'failed', 'compensation_stuck')"
    )
    wait_until(lambda: scalar(bench, settled, ids=ids) >= len(ids), timeout, 0.2, f"live {label}")
    found = {
        run: (state, ms)
        for run, state, ms in rows(
            bench,
            "SELECT id, state, EXTRACT(EPOCH FROM updated_at - created_at) * 1000 "
            "FROM saga_executions WHERE id = ANY(:ids)",
            ids=ids,
        )
    }
    if any(state != "completed" for state, _ in found.values()):
        raise SystemExit(f"live runs of {label} did not all complete")
    return [float(found[run][1]) for run in ids]


def _phase(bench: Any, label: str, rate: float, work: Callable[[], object]) -> list[float]:
    with _streaming(bench, rate) as started:
        work()
    return _latencies(bench, label, started)


def _summary(label: str, values: list[float], base_p95: float | None) -> str:
    p50 = statistics.median(values)
    p95, p99 = (
        (statistics.quantiles(values, n=100)[k] for k in (94, 98))
        if len(values) > 1
        else (values[0], values[0])
    )
    ratio = f"  ({p95 / base_p95:.2f}x the p95 without)" if base_p95 else ""
    tail = f"p99 {p99:6.1f} ms  max {max(values):6.1f} ms"
    return f"{label:22} {len(values):5} runs  p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  {tail}{ratio}"


def beside(
    url: str, rate: float, seconds: float, catch_ups: dict[str, Callable[[], list[str]]]
) -> list[str]:
    """Run each of ``catch_ups`` in turn between two quiet stretches of the live stream;
    their lines, then the stream's latency before, during each and after them."""
    bench = _configure(url)
    from bench_infra import Worker, purge_queue, running

    lines: list[str] = []
    tag = uuid.uuid4().hex[:4]
    during: dict[str, list[float]] = {}
    with running(Worker(bench, f"history-{tag}")):
        warm = _phase(bench, f"{tag}-before", rate, lambda: time.sleep(seconds + WARM_UP))
        before = warm[int(WARM_UP * rate) :]
        for index, (label, catch_up) in enumerate(catch_ups.items()):
            lines.append(f"catch-up {label}:")
            work = lambda run=catch_up: lines.extend("  " + line for line in run())  # noqa: E731
            during[label] = _phase(bench, f"{tag}-during{index}", rate, work)
        after = _phase(bench, f"{tag}-after", rate, lambda: time.sleep(seconds))
    purge_queue(bench)
    quiet = before + after
    base = statistics.quantiles(quiet, n=20)[-1]
    return [
        *lines,
        f"live five-step runs started at {rate:g}/s on a prefork 2 worker:",
        "  " + _summary("before the catch-up", before, None),
        "  " + _summary("after the catch-up", after, None),
        "  " + _summary("without (both)", quiet, None),
        *("  " + _summary(f"during {label}", found, base) for label, found in during.items()),
    ]
