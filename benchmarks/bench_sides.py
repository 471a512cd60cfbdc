"""The three workloads of ``chain_vs_saga.py`` and how one of them is timed.

- ``ChainSide``: a plain ``celery.chain`` of 5 ``bench.write`` tasks (one commit each).
- ``SagaSide``: ``bench_five``, 5 no-op steps; it must end ``completed``.
- ``UnwindSide``: ``bench_unwind``, whose 5th step fails; it must end ``failed`` with 4
  reversals done.
- ``ChainUnwindSide``: its plain analog, a chain of 4 writes and a failing task whose
  ``link_error`` runs a chain of 4 compensating writes.

Each side offers ``one()`` (submit one run and wait for it: latency), ``submit()`` /
``finished()`` / ``verify()`` (a batch in flight: throughput) and remembers the ids of its
single runs, so that ``hops()`` can read their step timestamps afterwards.
"""

from __future__ import annotations

import statistics
import time
import uuid
from itertools import pairwise
from typing import Any

from bench_infra import (
    BenchError,
    cpu_ms_per,
    process_cpu_seconds,
    rows,
    scalar,
    wait_until,
)

DONE_STATES = ("completed", "failed", "compensation_stuck")


class ChainSide:
    label = "chain"

    def __init__(self, bench: Any, poll: float) -> None:
        self.bench, self.poll = bench, poll
        self.submit_times: list[float] = []
        self.single_ids: list[str] = []
        last = self.last_seq()
        self.marker_sql = (
            f"SELECT count(*) FROM {bench.WRITES_TABLE} WHERE run_id = :r AND seq = {last}"
        )
        self.batch_sql = (
            f"SELECT count(*) FROM {bench.WRITES_TABLE} WHERE batch = :b AND seq = {last}"
        )

    def last_seq(self) -> int:
        """The row whose write ends one run."""
        return int(self.bench.STEPS_PER_RUN - 1)

    def signature(self, run_id: str, batch: str) -> Any:
        return self.bench.chain_signature(run_id, batch)

    def one(self, timeout: float) -> float:
        run_id, bench = uuid.uuid4().hex, self.bench
        started = time.perf_counter()
        self.signature(run_id, "latency").apply_async()
        self.submit_times.append(time.perf_counter() - started)
        wait_until(
            lambda: scalar(bench, self.marker_sql, r=run_id) > 0,
            timeout,
            self.poll,
            f"chain {run_id}",
        )
        self.single_ids.append(run_id)
        return time.perf_counter() - started

    def submit(self, batch: str, count: int) -> None:
        for index in range(count):
            self.signature(f"{batch}-{index}", batch).apply_async()

    def finished(self, batch: str) -> int:
        return int(scalar(self.bench, self.batch_sql, b=batch))

    def verify(self, batch: str, count: int) -> None:
        sql = f"SELECT count(*) FROM {self.bench.WRITES_TABLE} WHERE batch = :b"
        written = scalar(self.bench, sql, b=batch)
        if written != count * self.bench.STEPS_PER_RUN:
            raise BenchError(f"chain batch {batch}: {written} writes, expected {count * 5}")


class ChainUnwindSide(ChainSide):
    """The unwind's plain analog: 4 writes, a failing task, its ``link_error`` chain of 4
    compensating writes (``bench_app.chain_unwind_signature``); 9 rows per run."""

    label = "chain_unwind"

    def last_seq(self) -> int:
        return int(self.bench.UNDO_LAST_SEQ)

    def signature(self, run_id: str, batch: str) -> Any:
        return self.bench.chain_unwind_signature(run_id, batch)

    def verify(self, batch: str, count: int) -> None:
        sql = f"SELECT count(*) FROM {self.bench.WRITES_TABLE} WHERE batch = :b"
        written = scalar(self.bench, sql, b=batch)
        rows_per_run = self.bench.UNDO_LAST_SEQ + 1
        if written != count * rows_per_run:
            raise BenchError(f"chain unwind batch {batch}: {written} writes, expected {count * 9}")


class FailingTaskSide(ChainSide):
    """Plain Celery tasks that write their marker row, then raise (``bench.fail``)."""

    label = "failing task"

    def submit(self, batch: str, count: int) -> None:
        for index in range(count):
            self.bench.bench_fail.delay(f"{batch}-{index}", batch)

    def verify(self, batch: str, count: int) -> None:
        if self.finished(batch) != count:
            raise BenchError(f"failing task batch {batch}: {self.finished(batch)}/{count} ran")


class SagaSide:
    label = "saga"
    expected_state = "completed"

    def __init__(self, bench: Any, poll: float, traced: bool = False) -> None:
        """``traced``: with ``bench.TRACING_AB``, this side's runs are the traced ones (their
        ids start with ``bench.TRACED``, the others' never do: a hex digit or the label's
        first letter), and its label starts with ``traced_``."""
        self.bench, self.poll = bench, poll
        self.traced = traced
        if traced:
            self.label = f"traced_{self.label}"
        self.saga_name = bench.SAGA_NAME
        self.run_input: dict[str, Any] = {}
        self.submit_times: list[float] = []
        self.single_ids: list[str] = []
        states = ", ".join(f"'{s}'" for s in DONE_STATES)
        # A range of the primary key, as the chain's poll reads its own index: the batch's
        # ids are "<batch>-<n>" ("." sorts right after "-"). LIKE alone could not use the
        # index and would scan every settled run of the schema at each poll.
        self.state_sql = "SELECT state FROM saga_executions WHERE id = :i"
        self.batch_sql = (
            "SELECT count(*) FROM saga_executions WHERE id >= :lo AND id < :hi "
            f"AND id LIKE :p AND state IN ({states})"
        )

    def _start(self, execution_id: str | None = None) -> Any:
        """Start one run; with ``bench.TRACING_AB`` the driver's tracer (the root span's)
        first takes the run's mode, as the workers' does at each of its messages."""
        if self.bench.TRACING_AB:
            if execution_id is None:
                execution_id = f"{self.bench.TRACED if self.traced else ''}{uuid.uuid4().hex}"
            self.bench.trace_as(execution_id)
        return self.bench.engine.start(self.saga_name, self.run_input, execution_id=execution_id)

    def one(self, timeout: float) -> float:
        started = time.perf_counter()
        handle = self._start()
        self.submit_times.append(time.perf_counter() - started)
        # One indexed read per poll, as the chain's marker: ``handle.wait()`` reads the
        # whole run with its steps at each poll, which took 1-2 ms of the driver's CPU
        # under load (the run's end was seen 5 ms after its last write, at the median).
        wait_until(
            lambda: scalar(self.bench, self.state_sql, i=handle.id) in DONE_STATES,
            timeout,
            self.poll,
            f"{self.label} {handle.id}",
        )
        elapsed = time.perf_counter() - started
        execution = handle.get()
        if execution.state.value != self.expected_state:
            raise BenchError(
                f"{self.label} {handle.id} ended {execution.state.value}: "
                f"{execution.record.failure_reason}"
            )
        self.single_ids.append(handle.id)
        return elapsed

    def submit(self, batch: str, count: int) -> None:
        for index in range(count):
            self._start(f"{batch}-{index}")

    def finished(self, batch: str) -> int:
        return int(
            scalar(self.bench, self.batch_sql, lo=f"{batch}-", hi=f"{batch}.", p=f"{batch}-%")
        )

    def verify(self, batch: str, count: int) -> None:
        sql = "SELECT count(*) FROM saga_executions WHERE id LIKE :p AND state = :s"
        settled = scalar(self.bench, sql, p=f"{batch}-%", s=self.expected_state)
        if settled != count:
            raise BenchError(f"{self.label} batch {batch}: {settled}/{count} {self.expected_state}")
        self.verify_one(f"{batch}-{count - 1}")

    def verify_one(self, execution_id: str) -> None:
        execution = self.bench.engine.handle(execution_id).wait(timeout=5)
        if len(execution.steps) != self.bench.STEPS_PER_RUN:
            raise BenchError(f"saga {execution_id} has {len(execution.steps)} steps")


class UnwindSide(SagaSide):
    label = "unwind"
    expected_state = "failed"

    def __init__(self, bench: Any, poll: float, traced: bool = False) -> None:
        super().__init__(bench, poll, traced)
        self.saga_name = bench.UNWIND_NAME

    def verify_one(self, execution_id: str) -> None:
        sql = (
            "SELECT count(*) FROM saga_steps s JOIN saga_executions e "
            "ON e.id = s.execution_id WHERE e.id = :i AND s.compensated_at IS NOT NULL"
        )
        reversed_steps = scalar(self.bench, sql, i=execution_id)
        if reversed_steps != self.bench.STEPS_PER_RUN - 1:
            raise BenchError(f"unwind {execution_id}: {reversed_steps} reversals, expected 4")


class LoopSide(SagaSide):
    """``bench_loop``: a ``for_each`` of 3 steps, then a ``do_until`` of 2 (5 step records)."""

    label = "loop"

    def __init__(self, bench: Any, poll: float) -> None:
        super().__init__(bench, poll)
        self.saga_name, self.run_input = bench.LOOP_NAME, {"items": bench.LOOP_ITEMS}


class SignalSide(SagaSide):
    """``bench_signal``: each run parks at its gate (``waiting``), then gets its signal."""

    label = "signal"

    def __init__(self, bench: Any, poll: float) -> None:
        super().__init__(bench, poll)
        self.saga_name = bench.SIGNAL_NAME

    def submit(self, batch: str, count: int) -> None:
        super().submit(batch, count)
        sql = (
            "SELECT count(*) FROM saga_executions WHERE id >= :lo AND id < :hi "
            "AND id LIKE :p AND state = 'waiting'"
        )
        wait_until(
            lambda: (
                scalar(self.bench, sql, lo=f"{batch}-", hi=f"{batch}.", p=f"{batch}-%") >= count
            ),
            180,
            0.05,
            f"signal batch {batch} parked",
        )
        for index in range(count):
            self.bench.engine.signal(f"{batch}-{index}", self.bench.SIGNAL_EVENT)

    def verify_one(self, execution_id: str) -> None:
        """Checked by ``verify``: every run of the batch ``completed``."""


def throughput_round(
    side: Any, count: int, poll: float, timeout: float, worker_pid: int | None = None
) -> dict[str, float]:
    """Submit ``count`` runs at once; wall time until all are settled, then verify them."""
    batch = f"{side.label[0]}{uuid.uuid4().hex[:12]}"
    cpu_before = process_cpu_seconds(worker_pid) if worker_pid else None
    started = time.perf_counter()
    side.submit(batch, count)
    submitted = time.perf_counter()
    wait_until(
        lambda: side.finished(batch) >= count, timeout, poll, f"{side.label} batch of {count}"
    )
    elapsed = time.perf_counter() - started
    steps = count * side.bench.STEPS_PER_RUN
    result = {
        "seconds": elapsed,
        "submit": submitted - started,
        "runs_per_s": count / elapsed,
        "steps_per_s": steps / elapsed,
    }
    if cpu_before is not None:
        used = cpu_ms_per(cpu_before, process_cpu_seconds(worker_pid), steps)
        result.update({f"cpu_{group}": ms for group, ms in used.items()})
    side.verify(batch, count)
    return result


def hops(bench: Any, execution_ids: list[str]) -> dict[str, list[float]]:
    """Milliseconds from one node's recorded outcome to the next one's, per run.

    forward: between ``completed_at`` of consecutive steps (the failing step's too);
    reversal: from the failing step's ``completed_at`` to the first ``compensated_at``, then
    between consecutive ``compensated_at`` (steps reversed in reverse order); ``first``
    (recording the failure, then the first reversal) and ``later`` split them.
    """
    if not execution_ids:
        return {"forward": [], "reversal": [], "first": [], "later": []}
    found = rows(
        bench,
        "SELECT execution_id, node, completed_at, compensated_at FROM saga_steps "
        "WHERE execution_id = ANY(:ids) ORDER BY execution_id, node",
        ids=execution_ids,
    )
    by_run = _by_run(found, "execution_id")
    forward: list[float] = []
    first: list[float] = []
    later: list[float] = []
    for steps in by_run.values():
        done = [s.completed_at for s in steps]
        forward += [(b - a).total_seconds() * 1000 for a, b in pairwise(done)]
        undone = [s.compensated_at for s in reversed(steps) if s.compensated_at is not None]
        if undone:
            chain = [done[-1], *undone]
            gaps = [(b - a).total_seconds() * 1000 for a, b in pairwise(chain)]
            first, later = first + gaps[:1], later + gaps[1:]
    return {"forward": forward, "reversal": first + later, "first": first, "later": later}


def chain_hops(bench: Any, run_ids: list[str]) -> list[float]:
    """Milliseconds between consecutive writes of one chain (each row's ``written_at`` is
    its transaction's start, right before its INSERT): the chain's hop, as ``hops`` gives
    the saga's (each ``completed_at`` is stamped right before the outcome write)."""
    if not run_ids:
        return []
    found = rows(
        bench,
        f"SELECT run_id, written_at FROM {bench.WRITES_TABLE} "
        "WHERE run_id = ANY(:ids) ORDER BY run_id, seq",
        ids=run_ids,
    )
    return [
        (b.written_at - a.written_at).total_seconds() * 1000
        for written in _by_run(found, "run_id").values()
        for a, b in pairwise(written)
    ]


def _by_run(found: Any, column: str) -> dict[str, list[Any]]:
    """Rows grouped by the run named in ``column``, in the order they were read."""
    by_run: dict[str, list[Any]] = {}
    for row in found:
        by_run.setdefault(getattr(row, column), []).append(row)
    return by_run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
