"""The incident drill (``benchmarks/incident_drill.py``) at a small size, on real prefork
workers and PostgreSQL: a provider outage under policy ``hold`` ends with every run
completed and charged once after the CLI's bulk retry; a store outage during a bulk retry
of held runs is waited out by the one CLI run, each run retried once and charged once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import PORTS, ROOT, require_services


def _drill(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "benchmarks/incident_drill.py", *args, "--settle-budget", "90"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_provider_outage_holds_its_runs_and_the_clis_bulk_retry_completes_each_once() -> None:
    require_services(PORTS["postgres"], PORTS["postgres-rabbitmq"])
    options = ["--runs", "40", "--rate", "10", "--outage-after", "1", "--outage", "4"]
    (shown,) = _drill("--scenario", "outage", "--broker", "rabbitmq", "--policy", "hold", *options)
    assert shown["held_before_operator"] > 0, shown  # the outage was met
    assert shown["operator"] == "celery saga retry"
    assert f"{shown['held_before_operator']} acted on, 0 refused" in shown["operator_said"]
    assert (shown["completed"], shown["unwound"], shown["refunds"]) == (40, 0, 0), shown
    assert (shown["charges_total"], shown["most_charges_per_key"]) == (40, 1), shown


def test_a_store_outage_during_a_bulk_retry_is_waited_out_and_each_run_retried_once() -> None:
    require_services(PORTS["postgres"], PORTS["postgres-redis"])
    options = ["--held-runs", "60", "--store-outage", "5", "--bulk-rate", "20"]
    (shown,) = _drill("--scenario", "store-outage", "--broker", "redis", *options)
    assert shown["cut_while_cli_ran"] and shown["cli_exit"] == 0, shown
    assert shown["cli_s"] >= 5.0, shown  # it waited the outage out
    assert "60 acted on, 0 refused" in shown["cli_said"], shown
    assert (shown["completed"], shown["unwound"]) == (60, 0), shown
    assert (shown["runs_with_one_retry_row"], shown["most_retry_rows_per_run"]) == (60, 1)
    assert (shown["charges_total"], shown["most_charges_per_key"]) == (60, 1), shown
