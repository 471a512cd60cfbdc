"""The measured phases of ``chain_vs_saga.py``, each on a worker of its own.

1. ``timed``: warm-up, then latency (single runs, chain / saga / chain unwind / unwind
   interleaved) and
   throughput (batches in flight, interleaved the same way) on one uninstrumented worker;
   the step timestamps of the single runs give the forward and reversal hops.
2. ``counted``: a fresh worker with ``bench_profile`` loaded counts SQL statements, COMMITs
   and durable commits per task, by kind (chain task, forward node, failing node, reversal).
3. ``rss`` (optional): a fresh worker runs saga batches and its resident memory is read
   after 1,000 and after 10,000 sagas.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench_infra import Deadline, Worker, running, vacuum, worker_rss_mb
from bench_sides import (
    ChainSide,
    ChainUnwindSide,
    FailingTaskSide,
    LoopSide,
    SagaSide,
    SignalSide,
    UnwindSide,
    chain_hops,
    hops,
    throughput_round,
)

ORDER = ("chain", "saga", "chain_unwind", "unwind")
#: With ``--tracing-ab``: the traced runs, each interleaved with its untraced side.
TRACED = ("traced_saga", "traced_unwind")
#: Sides whose runs fail and unwind: ``--unwinds`` of them per round.
UNWINDING = ("chain_unwind", "unwind", "traced_unwind")


def make_sides(bench: Any, poll: float, traced: bool = False) -> dict[str, Any]:
    """The sides, in the order they take turns; ``traced`` (``--tracing-ab``) adds a traced
    saga after the saga and a traced unwind after the unwind (``order`` swaps each pair
    every other turn)."""
    sides = {
        "chain": ChainSide(bench, poll),
        "saga": SagaSide(bench, poll),
        "chain_unwind": ChainUnwindSide(bench, poll),
        "unwind": UnwindSide(bench, poll),
    }
    if traced:
        sides["traced_saga"] = SagaSide(bench, poll, traced=True)
        sides["traced_unwind"] = UnwindSide(bench, poll, traced=True)
    return sides


def order(sides: dict[str, Any], turn: int) -> list[str]:
    """The sides' order in turn ``turn``: chain, saga, chain_unwind, unwind, each untraced
    side followed by its traced one in even turns and preceded by it in odd turns, so that
    neither always runs right after a plain Celery side."""
    names = []
    for name in ORDER:
        pair = [name, f"traced_{name}"] if f"traced_{name}" in sides else [name]
        names += pair if turn % 2 == 0 else pair[::-1]
    return names


def _warm_up(sides: dict[str, Any], args: argparse.Namespace) -> None:
    """Every pool process opens its connections and imports everything (not measured)."""
    for _ in range(3):
        for side in sides.values():
            side.one(args.run_timeout)
    for side in sides.values():
        throughput_round(side, 20, args.batch_poll, args.batch_timeout)
        side.submit_times.clear()
        side.single_ids.clear()


def _latency(sides: dict[str, Any], args: argparse.Namespace, worker: Worker, deadline: Deadline):
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for turn in range(args.samples):
        for name in order(sides, turn):
            deadline.check("latency")
            worker.alive()
            samples[name].append(sides[name].one(args.run_timeout) * 1000)
    return samples


def _batch_size(name: str, args: argparse.Namespace) -> int:
    return args.unwinds if name in UNWINDING else args.batch


def _throughput(
    sides: dict[str, Any], args: argparse.Namespace, worker: Worker, deadline: Deadline
):
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for turn in range(args.rounds):
        for name in order(sides, turn):
            deadline.check("throughput")
            worker.alive()
            vacuumed = vacuum(sides[name].bench) if args.vacuum else None
            result = throughput_round(
                sides[name],
                _batch_size(name, args),
                args.batch_poll,
                args.batch_timeout,
                worker.pid,
            )
            rounds[name].append(result)
            before = "" if vacuumed is None else f", after a {vacuumed:.2f} s VACUUM ANALYZE"
            print(
                f"  round {name:<12}: {result['runs_per_s']:7.1f} runs/s "
                f"({result['steps_per_s']:.1f} steps/s{before})",
                flush=True,
            )
    return rounds


def timed(bench: Any, args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    """Latency, hops and throughput on one worker; ``--profile`` instruments it."""
    worker = Worker(bench, f"{bench.QUEUE[-10:]}-timed", profile=args.profile)
    # Stopping the worker lets profiled pool processes flush their last rows.
    with running(worker, args.keep):
        sides = make_sides(bench, args.poll, traced=bool(args.tracing_ab))
        began = time.monotonic()
        _warm_up(sides, args)
        print(f"  warm-up done after {time.monotonic() - began:.1f}s", flush=True)
        window_start = time.time()
        latency = _latency(sides, args, worker, deadline)
        windows = {"latency": (window_start, time.time())}
        measured_hops = {
            "chain": chain_hops(bench, sides["chain"].single_ids),
            "saga_forward": hops(bench, sides["saga"].single_ids)["forward"],
            **{
                f"unwind_{kind}": values
                for kind, values in hops(bench, sides["unwind"].single_ids).items()
            },
        }
        for name in TRACED if args.tracing_ab else ():
            for kind, values in hops(bench, sides[name].single_ids).items():
                measured_hops[f"{name}_{kind}"] = values
        window_start = time.time()
        throughput = _throughput(sides, args, worker, deadline)
        windows["throughput"] = (window_start, time.time())
    submit = {name: [t * 1000 for t in side.submit_times] for name, side in sides.items()}
    return {
        "latency": latency,
        "submit": submit,
        "hops": measured_hops,
        "throughput": throughput,
        "windows": windows,
    }


def counted(bench: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Mean statements / COMMITs / durable commits per task kind, on a profiled worker."""
    import bench_profile

    worker = Worker(bench, f"{bench.QUEUE[-10:]}-count", profile=True)
    with running(worker, args.keep):
        sides = make_sides(bench, args.poll)
        for _ in range(3):  # connections opened, statements prepared: not counted
            for side in sides.values():
                side.one(args.run_timeout)
        started = time.time()
        for side in sides.values():
            throughput_round(side, args.count_runs, args.batch_poll, args.batch_timeout)
    with bench.bench_db().connect() as connection:
        return bench_profile.means(connection, started, time.time())


def rss(bench: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Worker RSS (MB) after 1,000 and after 10,000 runs (``--rss-at``) of each workload of
    ``--rss-sides``, each on a fresh worker; keys ``<side>:<runs>``."""
    sides = {
        "saga": SagaSide,
        "unwind": UnwindSide,
        "fail": FailingTaskSide,
        "chain_unwind": ChainUnwindSide,
        "signal": SignalSide,
        "loop": LoopSide,
    }
    result: dict[str, dict[str, float]] = {}
    for name in args.rss_sides.split(","):
        side = sides[name](bench, args.poll)
        worker = Worker(bench, f"{bench.QUEUE[-10:]}-rss-{name}")
        done = 0
        with running(worker, args.keep):
            result[f"{name}:0"] = worker_rss_mb(worker.pid or 0)
            for checkpoint in sorted(int(n) for n in args.rss_at.split(",")):
                while done < checkpoint:
                    worker.alive()
                    size = min(args.batch, checkpoint - done)
                    throughput_round(side, size, args.batch_poll, args.batch_timeout)
                    done += size
                result[f"{name}:{checkpoint}"] = worker_rss_mb(worker.pid or 0)
                print(f"  rss after {done} {name} runs: {result[f'{name}:{checkpoint}']}")
    return result
