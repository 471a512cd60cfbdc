"""Plain Celery on the embedded worker: the floor under ``embedded.py``'s workloads.

The same in-process worker (``embedded_worker``: ``memory://`` broker, 4 threads) running
what a Celery user would write without the saga engine, and with no store at all:

``forward``  a chain of five no-op tasks.
``unwind``   a chain of four no-op tasks and a fifth that raises, its ``link_error`` a
             chain of four no-op compensation tasks (the analog ``chain_vs_saga.py``
             measures on the brokers).

Whatever CPU these take per workflow, a saga engine whose steps are Celery tasks takes at
least that too, before it stores anything.
"""

from __future__ import annotations

import threading
import time
from typing import Any

WORKLOADS = ("forward", "unwind")


def run(
    workload: str, runs: int, options: dict[str, Any], worker: dict[str, Any]
) -> dict[str, float]:
    """``runs`` workflows of ``workload`` started at once, after one to warm up."""
    from celery import Celery, chain

    from celery_saga.worker.embedded import embedded_worker

    app = Celery("embedded-celery-floor", broker="memory://localhost/")
    app.conf.update(worker_hijack_root_logger=False, task_ignore_result=True, **options)
    finished = [0]
    lock = threading.Lock()

    @app.task(name="floor.noop")
    def noop() -> None:
        return None

    @app.task(name="floor.fail")
    def fail() -> None:
        raise RuntimeError("the last step fails on purpose")

    @app.task(name="floor.last")
    def last() -> None:
        with lock:
            finished[0] += 1

    def start() -> None:
        steps = [noop.si() for _ in range(4)]
        if workload == "forward":
            chain(*steps, last.si()).apply_async()
            return
        undo = chain(*(noop.si() for _ in range(3)), last.si())
        chain(*steps, fail.si().on_error(undo)).apply_async()

    with embedded_worker(app, **worker):
        start()
        while finished[0] < 1:  # warm-up
            time.sleep(0.01)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(runs):
            start()
        while finished[0] < runs + 1:
            time.sleep(0.02)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"per_s": runs / wall, "cpu_ms": 1000 * cpu / runs}
