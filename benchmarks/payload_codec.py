"""What encrypting payloads at rest costs a forward node, beside the same run without it.

Each round runs the same workload twice, in fresh processes (the payload codec is a
process's): five-step sagas whose input and each result carry a payload of ``--payload``
bytes, on the embedded default (SQLite, in-process worker) or on PostgreSQL with an
in-process worker (``--store``). Per side it prints workflows/s and CPU per workflow
(medians of the rounds, the sides interleaved), and the codec side's ratio to plain msgpack;
then the cost of sealing and opening one payload alone.

    python benchmarks/payload_codec.py --runs 300 --rounds 3
    python benchmarks/payload_codec.py --store postgresql+psycopg://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = 5


def _side(store: str, runs: int, payload: int, encrypted: bool) -> dict[str, float]:
    """One side in this process: runs ``runs`` sagas, returns workflows/s and CPU each."""
    from celery import Celery

    from celery_saga import Saga, SagaContext, SagaEngine
    from celery_saga.worker.embedded import embedded_worker

    app = Celery("codec-bench", broker="memory://localhost/")
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    if encrypted:
        from celery_saga.encryption import new_key

        app.conf.saga_payload_keys = {"bench": new_key()}
    engine = SagaEngine(app, store_url=store)

    def work(ctx: SagaContext) -> dict[str, Any]:
        return {"note": ctx.input["note"], "step": ctx.step_name}

    saga = Saga("codec_bench")
    for index in range(STEPS):
        saga = saga.step(f"s{index}", work)
    engine.register(saga)
    engine.ensure_schema()
    note = "x" * payload
    with embedded_worker(app, concurrency=4):
        engine.start("codec_bench", {"note": note}).wait(timeout=60)  # warm-up
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(runs):
            engine.start("codec_bench", {"note": note})
        while _completed(engine) < runs + 1:  # one count a poll: the waiting costs no CPU
            time.sleep(0.02)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    engine.db.dispose()
    return {"per_s": runs / wall, "cpu_ms": 1000 * cpu / runs}


def _completed(engine: Any) -> int:
    from sqlalchemy import func, select

    from celery_saga.store.tables import executions

    query = select(func.count().label("n")).where(executions.c.state == "completed")
    return int(engine.db.read(query)[0]["n"])


def _one_payload(payload: int) -> tuple[float, float]:
    """Microseconds to pack and unpack one payload, plain and sealed."""
    from celery_saga.encryption import AESGCMCodec, new_key
    from celery_saga.store.codec import pack, unpack, use_codec

    value = {"note": "x" * payload, "n": 7}
    times = []
    for codec in (None, AESGCMCodec({"bench": new_key()})):
        use_codec(codec)
        seconds = timeit.timeit(lambda: unpack(pack(value)), number=20_000)
        times.append(seconds / 20_000 * 1e6)
    use_codec(None)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payload", type=int, default=200, help="bytes of payload per value")
    parser.add_argument("--store", help="a store URL (default: a fresh SQLite file per side)")
    parser.add_argument("--side", choices=("plain", "sealed"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(_side(args.store, args.runs, args.payload, args.side == "sealed")))
        return
    results: dict[str, list[dict[str, float]]] = {"plain": [], "sealed": []}
    with tempfile.TemporaryDirectory() as folder:
        for round_number in range(args.rounds):
            for side in ("plain", "sealed") if round_number % 2 == 0 else ("sealed", "plain"):
                store = args.store or f"sqlite:///{folder}/{side}-{round_number}.sqlite3"
                command = [sys.executable, __file__, "--side", side, "--store", store]
                command += ["--runs", str(args.runs), "--payload", str(args.payload)]
                out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
                results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.runs} five-step sagas x {args.rounds} rounds, {args.payload}-byte payloads")
    print(f"{'side':<8} {'workflows/s':>12} {'CPU ms/workflow':>16}")
    medians = {}
    for side, rows in results.items():
        per_s = statistics.median(r["per_s"] for r in rows)
        cpu = statistics.median(r["cpu_ms"] for r in rows)
        medians[side] = (per_s, cpu)
        print(f"{side:<8} {per_s:>12.1f} {cpu:>16.2f}")
    (plain_s, plain_cpu), (sealed_s, sealed_cpu) = medians["plain"], medians["sealed"]
    print(f"sealed/plain: throughput {sealed_s / plain_s:.2f}x, CPU {sealed_cpu / plain_cpu:.2f}x")
    plain_us, sealed_us = _one_payload(args.payload)
    print(f"pack+unpack of one payload: plain {plain_us:.1f} us, sealed {sealed_us:.1f} us")


if __name__ == "__main__":
    main()
