"""A payment provider's outage, with ``on_failure="hold"`` against ``"unwind"`` (issue 42).

Runs of a five-step checkout saga (validate, reserve, charge, ship, notify) are started at a
steady rate on the embedded default (SQLite store, in-process worker; ``--store`` and
``--broker`` point it elsewhere). ``charge`` calls a payment provider: a local HTTP
service that records each charge under the step's idempotency key (a second charge under
the same key counts twice: the effect a retry must not repeat) and ``refund`` under it.
In the middle of the starts the provider is stopped (its socket closed: connection
refused) for ``--outage`` seconds, then started again on the same port.

With ``--policy hold`` the runs whose ``charge`` exhausts its attempts during the outage
are held; once the provider is back the script retries every held run through the Python
API (``engine.retry``, a loop over ``engine.list(state="held")``), as an operator would.
With ``--policy unwind`` they unwind, as before issue 42; their refund calls the provider
too, so while it is down their unwinds park (``compensation_stuck``) and the script
resumes them once it is back. It prints, per policy: runs completed, unwound, held before
the retry and parked before the resume, charges per key (most and total), refunds, and the
time the operator's moves took to settle.

    python benchmarks/hold_outage.py --runs 500 --outage 60
    python benchmarks/hold_outage.py --runs 150 --rate 10 --outage 10 --policy unwind
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Provider:
    """The payment provider: charges and refunds by key, stoppable and restartable."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: Counter[str] = Counter()
        self.refunds: Counter[str] = Counter()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                kind, _, key = self.path.strip("/").partition("/")
                with provider.lock:
                    (provider.charges if kind == "charge" else provider.refunds)[key] += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server = server

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def call(self, kind: str, key: str) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{kind}/{key}", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5):
            pass


def _saga(provider: Provider, policy: str, retry: int, backoff: float) -> Any:
    from celery_saga import Saga, SagaContext

    def noop() -> None:
        return None

    def charge(ctx: SagaContext) -> dict[str, str]:
        provider.call("charge", ctx.idempotency_key)
        return {"charged": ctx.idempotency_key}

    def refund(ctx: SagaContext) -> None:
        provider.call("refund", ctx.forward_key)

    return (
        Saga(f"checkout_{policy}")
        .step("validate", noop)
        .step("reserve", noop, compensate=noop)
        .step("charge", charge, compensate=refund, retry=retry, backoff=backoff, on_failure=policy)
        .step("ship", noop, compensate=noop)
        .step("notify", noop)
    )


def _states(engine: Any, saga: str) -> Counter[str]:
    from celery_saga.store.inspection import run_counts

    counts = run_counts(engine.db, complete=True)
    return Counter({state: n for (name, state), n in counts.items() if name == saga})


def _ids(engine: Any, saga: str, state: str) -> list[str]:
    ids, cursor = [], None
    while True:
        page = engine.list(saga=saga, state=state, limit=1000, cursor=cursor)
        ids += [record.id for record in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return ids


def _wait_settled(engine: Any, saga: str, runs: int, allowed: set[str], budget: float) -> None:
    ends = time.monotonic() + budget
    while time.monotonic() < ends:
        states = _states(engine, saga)
        if sum(states[s] for s in allowed) >= runs:
            return
        time.sleep(0.2)
    raise SystemExit(f"not settled within {budget:g}s: {dict(_states(engine, saga))}")


def scenario(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    from celery import Celery

    from celery_saga import SagaEngine
    from celery_saga.worker.embedded import embedded_worker

    folder = tempfile.mkdtemp(prefix="hold-outage-")
    store = args.store or f"sqlite:///{folder}/store.sqlite3"
    app = Celery(f"outage-{policy}", broker=args.broker)
    app.conf.update(worker_hijack_root_logger=False, task_default_queue=f"outage-{policy}")
    engine = SagaEngine(app, store_url=store)
    provider = Provider()
    saga = _saga(provider, policy, args.retry, args.backoff)
    engine.register(saga)
    engine.ensure_schema()
    name = saga.name
    with embedded_worker(app, concurrency=args.concurrency):
        began = time.monotonic()
        outage_at = began + args.outage_after
        back_at = outage_at + args.outage
        stopped = False
        for index in range(args.runs):
            due = began + index / args.rate
            now = time.monotonic()
            if not stopped and now >= outage_at:
                provider.stop()
                stopped = True
            if due > now:
                time.sleep(due - now)
            engine.start(name, {"order": index})
        if not stopped:
            time.sleep(max(0.0, outage_at - time.monotonic()))
            provider.stop()
        time.sleep(max(0.0, back_at - time.monotonic()))
        provider.start()
        outage_seen = _states(engine, name)
        settled = {"completed", "failed", "held", "compensation_stuck"}
        _wait_settled(engine, name, args.runs, settled, args.settle_budget)
        before = _states(engine, name)
        started = time.monotonic()
        # What an operator does once the provider is back: retry the held runs; with
        # "unwind", resume the unwinds whose refund failed while it was down.
        for execution_id in _ids(engine, name, "held"):
            engine.retry(execution_id, actor="bench", reason="provider back")
        for execution_id in _ids(engine, name, "compensation_stuck"):
            engine.resume_compensation(execution_id, actor="bench")
        _wait_settled(engine, name, args.runs, {"completed", "failed"}, args.settle_budget)
        moved_in = time.monotonic() - started
        final = _states(engine, name)
    return {
        "policy": policy,
        "runs": args.runs,
        "outage_s": args.outage,
        "held_or_unwound_at_outage_end": dict(outage_seen),
        "held_before_retry": before["held"],
        "parked_before_resume": before["compensation_stuck"],
        "completed": final["completed"],
        "unwound": final["failed"],
        "still_held": final["held"],
        "charges_total": sum(provider.charges.values()),
        "most_charges_per_key": max(provider.charges.values(), default=0),
        "refunds": sum(provider.refunds.values()),
        "operator_moves_s": round(moved_in, 2),
        "wall_s": round(time.monotonic() - began, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=10.0, help="runs started per second")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the provider is down")
    parser.add_argument(
        "--outage-after", type=float, default=10.0, help="seconds after the first start"
    )
    parser.add_argument("--policy", choices=("hold", "unwind", "both"), default="both")
    parser.add_argument("--retry", type=int, default=3, help="charge's attempts")
    parser.add_argument("--backoff", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--store", help="a store URL (default: a fresh SQLite file)")
    parser.add_argument("--broker", default="memory://localhost/")
    parser.add_argument("--settle-budget", type=float, default=600.0)
    args = parser.parse_args()
    policies = ("hold", "unwind") if args.policy == "both" else (args.policy,)
    for policy in policies:
        print(json.dumps(scenario(args, policy)), flush=True)


if __name__ == "__main__":
    main()
