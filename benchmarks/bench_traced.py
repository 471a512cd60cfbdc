"""The traced runs of ``chain_vs_saga.py --tracing-ab MODE`` against the untraced ones.

With ``--tracing-ab`` one worker runs both kinds of run, interleaved one by one (latency)
and batch by batch (throughput), each pair in alternating order: a run traced as ``MODE``
(``api``: the OpenTelemetry API without an SDK; ``sdk``: an SDK dropping every span) and a
run with ``saga_tracing = False``. Both meet the same machine at the same moments, in the
same processes, so their difference is tracing's, not the drift between two workers or two
turns. Each figure is traced / untraced; the saga/chain ratios of both kinds are given too.
"""

from __future__ import annotations

import os
import random
import statistics
from typing import Any

#: (label, figure of the untraced side, of the traced side)
PAIRS = (
    ("latency median, saga", "saga_latency_median", "traced_saga_latency_median"),
    ("latency median, unwind", "unwind_latency_median", "traced_unwind_latency_median"),
    ("steps/s, saga", "saga_steps_per_s", "traced_saga_steps_per_s"),
    ("runs/s, unwind", "unwind_runs_per_s", "traced_unwind_runs_per_s"),
    ("worker CPU ms/step, saga", "saga_cpu", "traced_saga_cpu"),
    ("worker CPU ms/step, unwind", "unwind_cpu", "traced_unwind_cpu"),
    ("forward hop", "forward_hop", "traced_forward_hop"),
    ("latency ratio saga/chain", "latency_ratio", "traced_latency_ratio"),
    ("throughput ratio saga/chain", "throughput_ratio", "traced_throughput_ratio"),
)
#: (label, side, what is compared): the figures given a 95% interval; ``latency`` compares
#: the medians of the single runs, the others the means over the throughput rounds.
INTERVALS = (
    ("latency median, saga", "saga", "latency"),
    ("latency median, unwind", "unwind", "latency"),
    ("steps/s, saga", "saga", "steps_per_s"),
    ("runs/s, unwind", "unwind", "runs_per_s"),
    ("worker CPU ms/step, saga", "saga", "cpu_worker"),
    ("worker CPU ms/step, unwind", "unwind", "cpu_worker"),
)
DRAWS = 2000


def figures(result: dict[str, Any], s: dict[str, float]) -> dict[str, float]:
    """What the traced sides add to ``s`` (``bench_report.summary``'s figures of every side,
    the traced ones too): their forward hop and saga/chain ratios, and each of
    ``INTERVALS`` as ``ab_<side>_<what>`` with its bounds (``_low``, ``_high``)."""
    out: dict[str, float] = {}
    out["traced_forward_hop"] = statistics.median(result["hops"]["traced_saga_forward"])
    out["traced_latency_ratio"] = s["traced_saga_latency_median"] / s["chain_latency_median"]
    out["traced_throughput_ratio"] = s["traced_saga_steps_per_s"] / s["chain_steps_per_s"]
    for _label, side, what in INTERVALS:
        key = f"ab_{side}_{what}"
        out[key], out[f"{key}_low"], out[f"{key}_high"] = interval(*_paired(result, side, what))
    return out


def _paired(result: dict[str, Any], side: str, what: str) -> tuple[list[float], list[float], Any]:
    """The untraced and the traced values of ``what``, pair by pair, and the statistic
    compared."""
    if what == "latency":
        plain, traced = result["latency"][side], result["latency"][f"traced_{side}"]
        return plain, traced, statistics.median
    rounds = result["throughput"]
    plain = [r.get(what, float("nan")) for r in rounds[side]]
    traced = [r.get(what, float("nan")) for r in rounds[f"traced_{side}"]]
    return plain, traced, statistics.fmean


def interval(
    plain: list[float], traced: list[float], stat: Any, draws: int = DRAWS
) -> tuple[float, float, float]:
    """``stat(traced) / stat(plain)``, and its 95% interval: the pairs (each pair ran back
    to back) drawn again with replacement ``draws`` times (a fixed seed: the same data give
    the same interval)."""
    pairs = list(zip(plain, traced, strict=True))
    rng = random.Random(0)
    ratios = []
    for _ in range(draws):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(stat([t for _, t in drawn]) / stat([p for p, _ in drawn]))
    ratios.sort()
    point = stat(traced) / stat(plain)
    return point, ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def print_traced(result: dict[str, Any], s: dict[str, float]) -> None:
    mode = os.environ.get("BENCH_TRACING", "?")
    print(f"\n== traced ({mode}) / untraced (saga_tracing = False), interleaved on one worker")
    print("  (medians: of the single runs, of the rounds; CPU: mean of the rounds)")
    for label, plain, traced in PAIRS:
        change = (s[traced] / s[plain] - 1) * 100
        print(f"  {label:<30} {s[plain]:10.3f} {s[traced]:10.3f}  {change:+6.1f}%")
    pairs = len(result["throughput"]["saga"]), len(result["latency"]["saga"])
    print(
        f"  traced/untraced and its 95% interval ({pairs[0]} round pairs: means of the rounds; "
        f"{pairs[1]} run pairs: medians of the runs):"
    )
    for label, side, what in INTERVALS:
        key = f"ab_{side}_{what}"
        low, high = (s[f"{key}{end}"] for end in ("_low", "_high"))
        print(
            f"  {label:<30} {(s[key] - 1) * 100:+6.1f}%  "
            f"[{(low - 1) * 100:+6.1f}%, {(high - 1) * 100:+6.1f}%]"
        )
