#!/usr/bin/env python
"""Benchmark: a plain 5-task ``celery.chain`` against a 5-step saga, on RabbitMQ and Redis.

For each broker (``--broker rabbitmq|redis|both``) one run of this script:

1. creates a private PostgreSQL schema and a private queue (unique names),
2. on one real ``celery worker`` (prefork, concurrency 2, prefetch 1, ``-O fair``, no
   events) that imports ``bench_app`` (beside this file), warms up, then measures,
   interleaving the plain chain, the saga and a saga whose 5th step fails (unwind):
   - latency: one run end to end, ``--samples`` rounds of chain, saga, unwind,
   - forward and reversal hops, from the step timestamps of those single runs,
   - throughput: ``--batch`` chains, ``--batch`` sagas and ``--unwinds`` failing sagas in
     flight, ``--rounds`` rounds in the same order, each after a ``VACUUM ANALYZE`` of the
     schema's tables (what autovacuum does on a default server; ``--no-vacuum`` skips it),
3. on a fresh, profiled worker, counts statements and commits per node of each kind,
4. with ``--rss``, on a fresh worker per workload (``--rss-sides``: the saga, the unwind,
   and the baseline of a plain Celery task that fails; also ``signal``, ``loop`` and
   ``chain_unwind``):
   its RSS after 1,000 and after 10,000 of them (``--rss-only``: this phase alone),
5. prints the figures and the saga/chain ratios, stops every worker it started, purges and
   deletes its queue and exchange and drops its schema -- also on errors and Ctrl-C.

``--broker both`` runs the script once per broker (a child process each, one after the
other) and prints a summary with a column per broker. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_infra import (
    BenchError,
    Deadline,
    configure_environment,
    drop_schema,
    loadavg,
    prepare_database,
    print_environment,
    purge_queue,
)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--broker", choices=("rabbitmq", "redis", "both"), default="rabbitmq")
    add("--samples", type=int, default=30, help="latency samples per side")
    add("--batch", type=int, default=500, help="chains / sagas in flight per round")
    add("--unwinds", type=int, default=200, help="failing sagas in flight per round")
    add("--rounds", type=int, default=2, help="throughput rounds per side")
    add("--count-runs", type=int, default=20, help="runs per side in the counting phase")
    add("--rss", action="store_true", help="also run 10,000 sagas and report worker RSS")
    add("--rss-at", default="1000,10000", help="saga counts at which --rss reads the RSS")
    add(
        "--rss-sides",
        default="saga,unwind,fail",
        help=(
            "workloads --rss runs, each on a fresh worker, of saga, unwind, fail (a plain "
            "failing task), chain_unwind, signal, loop"
        ),
    )
    add("--rss-only", action="store_true", help="skip the timed and counting phases")
    add("--poll", type=float, default=0.005, help="poll interval, one latency sample (s)")
    add("--batch-poll", type=float, default=0.02, help="poll interval, one batch (s)")
    add("--run-timeout", type=float, default=30.0, help="limit for one latency sample (s)")
    add("--batch-timeout", type=float, default=180.0, help="limit for one batch (s)")
    add("--max-seconds", type=float, default=900.0, help="limit for one broker's run (s)")
    add(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="do not VACUUM ANALYZE the tables before each throughput round",
    )
    add("--profile", action="store_true", help="instrument the timed worker (bench_profile)")
    add(
        "--tracing",
        choices=("off", "api", "sdk"),
        default="off",
        help="tracing in the workers: off, the API without an SDK, an SDK dropping every span",
    )
    add(
        "--tracing-ab",
        choices=("api", "sdk"),
        help=(
            "trace every other run as api or sdk and the rest not at all, interleaved on the "
            "same worker (bench_traced.py); replaces --tracing"
        ),
    )
    add("--keep", action="store_true", help="keep the schema and the worker logs")
    add("--json-out", help=argparse.SUPPRESS)  # used by --broker both
    return parser.parse_args()


def _measure(bench: Any, args: argparse.Namespace) -> dict[str, Any]:
    import bench_phases
    import bench_report

    deadline = Deadline(args.max_seconds)
    if args.rss_only:
        result = {"rss": bench_phases.rss(bench, args)}
        bench_report.print_rss(result["rss"])
        return result
    result = bench_phases.timed(bench, args, deadline)
    if args.profile:
        import bench_hop_split
        import bench_profile

        print("\n== profile of the timed worker: mean per task (ms, counts)")
        with bench.bench_db().connect() as connection:
            for line in bench_profile.summarize(connection, result["windows"]):
                print(line)
            print("\n== where a hop of the single runs goes (profiled worker)")
            for line in bench_hop_split.report(
                bench_hop_split.split(connection, *result["windows"]["latency"])
            ):
                print(line)
    deadline.check("counting")
    result["counts"] = bench_phases.counted(bench, args)
    if args.rss:
        deadline.check("rss")
        result["rss"] = bench_phases.rss(bench, args)
    result["summary"] = bench_report.print_broker(result)
    return result


def run_broker(args: argparse.Namespace) -> int:
    run_id = uuid.uuid4().hex[:10]
    configure_environment(run_id, args.broker, args.profile)
    os.environ["BENCH_TRACING"] = args.tracing_ab or args.tracing
    os.environ["BENCH_TRACING_AB"] = "1" if args.tracing_ab else "0"
    import bench_app as bench  # after configure_environment: it reads the environment

    began = time.monotonic()
    schema_created = False
    try:
        prepare_database(bench)
        schema_created = True
        print_environment(bench, args.broker)
        result = _measure(bench, args)
        result["broker"] = args.broker
        result["tracing_ab"] = args.tracing_ab
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result))
        print(f"\nload average at end: {loadavg()}; finished in {time.monotonic() - began:.1f}s")
        return 0
    finally:
        with contextlib.suppress(Exception):
            purged = purge_queue(bench)
            if purged:
                print(f"purged {purged} leftover message(s) from {bench.QUEUE}")
        if schema_created and not args.keep:
            with contextlib.suppress(Exception):
                drop_schema(bench)
        elif schema_created:
            print(f"schema kept: {bench.SCHEMA}")
        with contextlib.suppress(Exception):
            bench.engine.db.dispose()
            bench.bench_db().dispose()


def run_both(argv: list[str]) -> int:
    """One child per broker, one after the other; then a summary of both."""
    import bench_report

    results = {}
    base = [a for a in argv if a not in ("--broker", "both") and not a.startswith("--broker=")]
    for broker in ("rabbitmq", "redis"):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
            path = out.name
        print(f"\n######## broker {broker}", flush=True)
        command = [sys.executable, __file__, *base, "--broker", broker, "--json-out", path]
        child = subprocess.Popen(command)
        try:
            code = child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGTERM)  # the child stops its own workers
            child.wait(timeout=60)
            raise
        if code != 0:
            print(f"broker {broker} failed with exit code {code}", file=sys.stderr)
            return code
        results[broker] = json.loads(Path(path).read_text())
        Path(path).unlink()
    bench_report.print_both(results)
    return 0


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    args = _parse_args()
    with _sigterm_as_interrupt():
        try:
            if args.broker == "both":
                return run_both(sys.argv[1:])
            return run_broker(args)
        except (BenchError, TimeoutError) as error:
            print(f"benchmark failed: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; cleaned up", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
