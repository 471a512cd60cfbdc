"""Work the package itself does per workflow, counted, not timed: bytecodes and calls.

CPU time on a shared 2-core machine moves by more than a refactor of the runtime costs,
and the timed benchmarks (``chain_vs_saga.py``, ``embedded.py``) cannot tell 2 % from the
machine's mood. This one counts: on the embedded default (SQLite, in-process worker), it
traces every frame of ``celery_saga`` in the worker's threads while ``--runs`` workflows
of one workload run (the warm-up run and the driver's own polls are not counted), and
prints the bytecodes executed and the calls made per workflow, by subpackage, and the
functions that execute the most. The counts are the same from run to run (to within a
renewal or a retry that timing decides), whatever else the machine does, so two commits
compare by running this script against each (Celery, kombu, SQLAlchemy and the drivers
are not counted: they are the same on both sides):

    python benchmarks/package_work.py --workload unwind
    PYTHONPATH=<a checkout of the other commit> python benchmarks/package_work.py --workload unwind

A bytecode is not a unit of time (a call or an allocation costs more than a load), so
read it beside the calls; it finds where the package's own work went, which a profile
blurs at these sizes.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import embedded


class Counter:
    """Bytecodes and calls of the package's frames, by ``module:function``, while on."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.on = False
        self.ops: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        """The global tracer of each worker thread: a local one for the package's frames."""
        path = frame.f_code.co_filename
        if not path.startswith(self.package):
            return None
        key = f"{path[len(self.package) :]}:{frame.f_code.co_name}"
        if self.on:
            self.calls[key] += 1
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        ops = self.ops

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode" and self.on:
                ops[key] += 1
            return local

        return local


def measure(workload: str, runs: int) -> Counter:
    """Run ``workload`` ``runs`` times after one warm-up run, counting the runs only."""
    import celery_saga
    from celery_saga.worker.embedded import embedded_worker

    counter = Counter(str(Path(celery_saga.__file__).parent) + "/")
    threading.settrace(counter.trace)  # the worker's threads start below
    try:
        with tempfile.TemporaryDirectory() as folder:
            app, engine = embedded._engine(folder, {})
            with embedded_worker(app):
                signalled: set[str] = set()
                engine.start(workload, {})
                while embedded._settled(engine, workload, signalled) < 1:
                    time.sleep(0.01)
                counter.on = True
                for _ in range(runs):
                    engine.start(workload, {})
                while embedded._settled(engine, workload, signalled) < runs + 1:
                    time.sleep(0.05)
                counter.on = False
            engine.db.dispose()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    return counter


def report(counter: Counter, runs: int, top: int) -> None:
    by_module: collections.Counter[str] = collections.Counter()
    calls_by_module: collections.Counter[str] = collections.Counter()
    for key, ops in counter.ops.items():
        by_module[key.split("/")[0].split(":")[0]] += ops
    for key, calls in counter.calls.items():
        calls_by_module[key.split("/")[0].split(":")[0]] += calls
    total, calls = sum(counter.ops.values()), sum(counter.calls.values())
    print(f"per workflow: {total / runs:,.0f} bytecodes, {calls / runs:,.1f} calls")
    for module, ops in by_module.most_common():
        called = calls_by_module[module] / runs
        print(f"  {module:<16} {ops / runs:>10,.0f} bytecodes {called:>8,.1f} calls")
    print(f"the {top} functions that execute the most, per workflow:")
    for key, ops in counter.ops.most_common(top):
        print(f"  {ops / runs:>9,.1f} {counter.calls[key] / runs:>7,.2f} calls  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=embedded.WORKLOADS, default="forward")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the unwind's failing step logs, as it should
    counter = measure(args.workload, args.runs)
    package = sys.modules["celery_saga"].__file__
    print(f"{args.workload}, {args.runs} workflows, package at {package}")
    report(counter, args.runs, args.top)


if __name__ == "__main__":
    main()
