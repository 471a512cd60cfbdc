"""The counting benchmark counts the package's own work per workflow, and the same work
twice over: its counts do not depend on how busy the machine is."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def _counted(workload: str) -> tuple[int, float]:
    done = subprocess.run(
        [sys.executable, "benchmarks/package_work.py", "--workload", workload, "--runs", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    total = re.search(r"^per workflow: ([\d,]+) bytecodes, ([\d,.]+) calls$", done.stdout, re.M)
    assert total is not None, done.stdout
    for module in ("runtime", "store", "worker"):
        assert re.search(rf"^  {module}\s+[\d,]+ bytecodes\s+[\d,.]+ calls$", done.stdout, re.M)
    return int(total[1].replace(",", "")), float(total[2].replace(",", ""))


def test_the_package_work_of_a_workload_is_counted_the_same_each_time() -> None:
    first, again = _counted("unwind"), _counted("unwind")
    assert first[0] > 10_000 and first[1] > 500  # a step's claim and outcome, reversals...
    # A lease renewal or a retried write that timing decides may add a little.
    assert abs(first[0] - again[0]) <= first[0] * 0.02, (first, again)
