"""A rolling deploy under load: 200 runs of ``deploy`` (tests/versioned_app.py) across every
node kind, while 2 old workers (version 1) and 2 new ones (versions 1 and 2) run side by
side, then the old ones stop. Every signal comes from a process with version 2 only (a web
process deployed first), so the signals of version 1 runs are handed on. Prints how the
runs ended.

    SAGA_TEST_PG_DATABASE=... python -m benchmarks.rolling_deploy [runs]

Needs RabbitMQ and PostgreSQL as the test suite does (tests/conftest.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.conftest import BROKERS, _test_database_url
from tests.deploy_rig import DeployRig
from tests.versioned_app import DEPLOY_STEPS

OLD, NEW = ("old-1", "old-2"), ("new-1", "new-2")


def main(runs: int = 200) -> None:
    with tempfile.TemporaryDirectory() as folder:
        rig = DeployRig(BROKERS["postgres-rabbitmq"], _test_database_url(), Path(folder))
        try:
            report(rig, runs)
        finally:
            rig.close()


def report(rig: DeployRig, runs: int) -> None:
    began = time.monotonic()
    old_share, failing_share = runs // 2, runs // 10
    for name in OLD:
        rig.start_worker(name, "1")
    ids = rig.start("1", old_share - failing_share // 2)
    failing = rig.start("1", failing_share // 2, fail=True, pace=0.2)
    for name in NEW:
        rig.start_worker(name, "1,2")
    ids += rig.start("1,2", runs - old_share - (failing_share - failing_share // 2))
    failing += rig.start("1,2", failing_share - failing_share // 2, fail=True, pace=0.2)
    every = ids + failing
    stopped: list[float] = []

    def stop_old_midway() -> None:
        if not stopped and sum(1 for i in every if rig.client.get(i).steps) >= runs // 2:
            for name in OLD:
                rig.stop_worker(name)
            stopped.append(time.monotonic() - began)

    ended = rig.drive(every, timeout=1800, during=stop_old_midway, signal_by="2")
    v1 = rig.clients["1"].definition("deploy").hash
    tags = {v1: "1", rig.client.definition("deploy").hash: "2"}
    counts: Counter[str] = Counter()
    for execution_id, execution in ended.items():
        tag = tags[execution.record.definition_hash]
        counts[f"v{tag} {execution.state.value}"] += 1
        names = {s.name for s in execution.steps}
        expected = DEPLOY_STEPS[tag] - ({"ship"} if execution_id in failing else set())
        if names != expected:
            counts["steps not those of the run's own version"] += 1
        own_reason = "declined" in (execution.failure_reason or "")
        if execution.state.value == "failed" and not (execution_id in failing and own_reason):
            counts["failed or unwound because of the deploy"] += 1
    doubled = sum(1 for n in rig.ledger_keys().values() if n > 1)
    hand_backs = sum(rig.log(name).count("handed back") for name in OLD + NEW)
    print(f"runs: {runs} ({len(failing)} fail on their own step and unwind)")
    print(f"old workers stopped after {stopped[0] if stopped else float('nan'):.1f} s")
    for key, value in sorted(counts.items()):
        print(f"{key}: {value}")
    deploy_failures = counts["failed or unwound because of the deploy"]
    print(f"failed or unwound because of the deploy: {deploy_failures}")
    print(f"effects applied twice: {doubled}")
    print(f"hand-backs logged: {hand_backs}")
    print(f"wall time: {time.monotonic() - began:.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
