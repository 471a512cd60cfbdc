"""The embedded benchmark runs its three workloads to the end and reports each beside
bunqueue's figures and, for forward and unwind, beside plain Celery on the same worker."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def test_embedded_benchmark_settles_every_workload_and_reports_it() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/embedded.py", "--runs", "10", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    number = r"\s+\d+\.\d+"
    for workload, (peer_rate, peer_cpu) in {
        "forward": ("148", "5.3"),
        "unwind": ("120", "6.4"),
        "signal": ("200", "4.1"),
    }.items():
        floor = r"\s+-\s+-" if workload == "signal" else rf"({number}){{2}}"
        row = rf"^{workload}({number}){{3}}\s+{peer_rate}\s+{peer_cpu}({number}x){{2}}{floor}$"
        assert re.search(row, done.stdout, re.M), done.stdout
