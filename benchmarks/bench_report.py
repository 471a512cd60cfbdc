"""Printing the results of ``chain_vs_saga.py`` (one broker, or the summary of both)."""

from __future__ import annotations

import statistics
from typing import Any

from bench_infra import CPU_GROUPS, cpu_means

ORDER = ("chain", "saga", "chain_unwind", "unwind")
COUNT_KINDS = (
    ("chain", "chain task (bench.write)"),
    ("chain-fail", "plain failing task (bench.fail)"),
    ("saga", "saga forward node"),
    ("unwind-fwd", "forward node of an unwinding run"),
    ("unwind-fail", "failing node (starts the unwind)"),
    ("reversal", "reversal"),
)


def _p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(result: dict[str, Any]) -> dict[str, float]:
    """The headline figures of one broker's run."""
    latency, rounds, hop = result["latency"], result["throughput"], result["hops"]
    out: dict[str, float] = {}
    for name in rounds:  # every side that ran: ORDER's, and --tracing-ab's traced twins
        out[f"{name}_latency_median"] = _median(latency[name])
        out[f"{name}_latency_p95"] = _p95(latency[name])
        out[f"{name}_runs_per_s"] = _median([r["runs_per_s"] for r in rounds[name]])
        out[f"{name}_steps_per_s"] = _median([r["steps_per_s"] for r in rounds[name]])
        # The worker's CPU ms per step, the mean of the rounds (NaN: not measured).
        out[f"{name}_cpu"] = statistics.mean(
            r.get("cpu_worker", float("nan")) for r in rounds[name]
        )
    out["chain_hop"] = _median(hop.get("chain", []))
    out["forward_hop"] = _median(hop["saga_forward"])
    out["unwind_forward_hop"] = _median(hop["unwind_forward"])
    out["reversal_hop"] = _median(hop["unwind_reversal"])
    out["first_reversal_hop"] = _median(hop.get("unwind_first", []))
    out["later_reversal_hop"] = _median(hop.get("unwind_later", []))
    out["latency_ratio"] = out["saga_latency_median"] / out["chain_latency_median"]
    out["p95_ratio"] = out["saga_latency_p95"] / out["chain_latency_p95"]
    out["throughput_ratio"] = out["saga_steps_per_s"] / out["chain_steps_per_s"]
    pairs = _round_ratios(rounds)
    out["throughput_ratio_low"], out["throughput_ratio_high"] = min(pairs), max(pairs)
    out["unwind_ratio"] = out["unwind_runs_per_s"] / out["chain_unwind_runs_per_s"]
    pairs = _round_ratios(rounds, "chain_unwind", "unwind")
    out["unwind_ratio_low"], out["unwind_ratio_high"] = min(pairs), max(pairs)
    if "cpu_worker" in rounds["unwind"][0]:
        for name in ("chain_unwind", "unwind"):
            out[f"{name}_cpu_per_run"] = _cpu_per_run(result, name)
    out["reversal_ratio"] = out["reversal_hop"] / out["forward_hop"]
    out["first_ratio"] = out["first_reversal_hop"] / out["forward_hop"]
    out["later_ratio"] = out["later_reversal_hop"] / out["forward_hop"]
    out["hop_ratio"] = out["forward_hop"] / out["chain_hop"]
    for side, (first, last) in rss_growth(result.get("rss") or {}).items():
        out[f"rss_first_{side}"], out[f"rss_last_{side}"] = first, last
    if "traced_saga" in latency:
        import bench_traced

        out.update(bench_traced.figures(result, out))
    return out


def rss_growth(rss: dict[str, dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Per workload: total RSS at the first and at the last checkpoint after 0 runs."""
    growth = {}
    for side in dict.fromkeys(key.split(":")[0] for key in rss):
        counts = sorted(int(k.split(":")[1]) for k in rss if k.startswith(f"{side}:"))
        counts = [n for n in counts if n]
        if counts:
            growth[side] = (
                rss[f"{side}:{counts[0]}"]["total"],
                rss[f"{side}:{counts[-1]}"]["total"],
            )
    return growth


def _round_ratios(
    rounds: dict[str, list[dict[str, float]]], base: str = "chain", side: str = "saga"
) -> list[float]:
    """side/base steps/s of each round (saga/chain by default): a round of ``side`` runs
    right after its round of ``base``, so a ratio per round shows how much the machine
    moved between rounds."""
    pairs = zip(rounds[base], rounds[side], strict=True)
    return [ours["steps_per_s"] / theirs["steps_per_s"] for theirs, ours in pairs]


def _cpu_per_run(result: dict[str, Any], name: str) -> float:
    """CPU ms of all four groups per run of ``name`` (mean of its rounds)."""
    rounds = result["throughput"][name]
    per_step = sum(r[f"cpu_{g}"] for r in rounds for g in CPU_GROUPS) / len(rounds)
    return float(per_step * result.get("steps_per_run", 5))


def _print_latency(result: dict[str, Any], s: dict[str, float]) -> None:
    print("\n== latency of one 5-step run, end to end (ms), interleaved chain / saga / unwind")
    print(f"  {'':<12} {'median':>8} {'p95':>8} {'min':>8} {'max':>8} {'submit':>8}")
    for name in ORDER:
        values, submit = result["latency"][name], result["submit"][name]
        print(
            f"  {name:<12} {s[name + '_latency_median']:8.1f} {s[name + '_latency_p95']:8.1f} "
            f"{min(values):8.1f} {max(values):8.1f} {_median(submit):8.2f}"
        )
    print("  (unwind = 4 forward steps, the failing 5th, 4 reversals, until `failed`;")
    print("   chain_unwind = 4 writes, a failing task, its link_error chain of 4 writes)")


def _print_throughput(result: dict[str, Any], s: dict[str, float]) -> None:
    print("\n== throughput: a batch submitted at once, wall time until all settled")
    for name in ORDER:
        rounds = result["throughput"][name]
        detail = "  ".join(f"{r['runs_per_s']:.1f} ({r['seconds']:.2f}s)" for r in rounds)
        print(
            f"  {name:<12} median {s[name + '_runs_per_s']:7.1f} runs/s  "
            f"{s[name + '_steps_per_s']:7.1f} steps/s   rounds (runs/s): {detail}"
        )
    print(f"  unwinds/s (failing sagas fully unwound per second): {s['unwind_runs_per_s']:.1f}")
    ratios = "  ".join(f"{r:.2f}" for r in _round_ratios(result["throughput"]))
    print(f"  saga/chain steps/s per round (each saga round right after its chain round): {ratios}")
    ratios = "  ".join(
        f"{r:.2f}" for r in _round_ratios(result["throughput"], "chain_unwind", "unwind")
    )
    print(f"  unwind/chain_unwind runs/s per round: {ratios}")
    if "cpu_worker" in result["throughput"]["chain"][0]:
        print("  CPU ms per step (mean; postgres/broker include other load on those servers):")
        for name in ORDER:
            print(f"    {name:<12} " + cpu_means(result["throughput"][name], prefix="cpu_"))
        print(
            "  CPU ms per unwound run, all four groups: "
            f"chain_unwind {s['chain_unwind_cpu_per_run']:.1f}, "
            f"unwind {s['unwind_cpu_per_run']:.1f}"
        )


def _print_hops(result: dict[str, Any], s: dict[str, float]) -> None:
    hop = result["hops"]
    print("\n== hops of the single runs (ms, from one node's recorded outcome to the next's)")
    chain = hop.get("chain", [])
    print(
        f"  chain hop    (write, write)  median {s['chain_hop']:6.2f}  "
        f"p95 {_p95(chain):6.2f}  n={len(chain)}"
    )
    print(
        f"  forward hop  (saga)          median {s['forward_hop']:6.2f}  "
        f"p95 {_p95(hop['saga_forward']):6.2f}  n={len(hop['saga_forward'])}"
    )
    print(
        f"  forward hop  (unwinding run) median {s['unwind_forward_hop']:6.2f}  "
        f"p95 {_p95(hop['unwind_forward']):6.2f}  n={len(hop['unwind_forward'])}"
    )
    print(
        f"  reversal hop                 median {s['reversal_hop']:6.2f}  "
        f"p95 {_p95(hop['unwind_reversal']):6.2f}  n={len(hop['unwind_reversal'])}"
    )
    for kind, label in (("first", "failure, reversal"), ("later", "reversal, reversal")):
        values = hop.get(f"unwind_{kind}", [])
        name = f"    {kind} ({label})"
        print(f"{name:<31}median {_median(values):6.2f}  n={len(values)}")


def print_counts(counts: dict[str, dict[str, float]]) -> None:
    print("\n== per task, counted on a profiled worker (means; durable = waits for a WAL flush)")
    print(
        f"  {'task':<34} {'tasks':>6} {'stmts':>6} {'COMMIT':>6} {'durable':>7} {'wall ms':>8} "
        f"{'CPU ms':>7}"
    )
    for kind, label in COUNT_KINDS:
        m = counts.get(kind)
        if m is None:
            continue
        print(
            f"  {label:<34} {m['tasks']:>6} {m['statements']:6.2f} {m['commits']:6.2f} "
            f"{m['durable']:7.2f} {m['wall_ms']:8.2f} {m['cpu_ms']:7.2f}"
        )
    print("  (a statement in autocommit is its own transaction: durable if it writes, except")
    print("   a claim, which sets synchronous_commit off for itself; CPU: the pool process's,")
    print("   from task_prerun to task_postrun, which includes Celery's handling of a failure)")


def print_rss(rss: dict[str, dict[str, float]] | None) -> None:
    if not rss:
        return
    print("\n== worker RSS (MB): main process, largest pool process, total")
    for key, m in rss.items():
        side, done = key.split(":")
        print(
            f"  {side:6} after {int(done):>6} runs: main {m['main']:6.1f}  pool max "
            f"{m['pool_max']:6.1f}  total {m['total']:6.1f}"
        )
    for side, (first, last) in rss_growth(rss).items():
        print(f"  {side} growth: {(last / first - 1) * 100:+.1f}% (target: within 5%)")


def print_ratios(s: dict[str, float]) -> None:
    print("\n== saga / chain, same interleaved run")
    lines = (
        ("latency median saga/chain", s["latency_ratio"], "<= 1.15x", s["latency_ratio"] <= 1.15),
        ("latency p95    saga/chain", s["p95_ratio"], "", None),
        ("  forward hop / chain hop", s["hop_ratio"], "", None),
        (
            "throughput     saga/chain",
            s["throughput_ratio"],
            ">= 0.85x",
            s["throughput_ratio"] >= 0.85,
        ),
        # A reversal's own hop runs from one reversal's outcome to the next's; the first
        # hop runs from the failing step's record instead (see the README).
        ("reversal hop / forward hop", s["later_ratio"], "<= 1.1x", s["later_ratio"] <= 1.1),
        (
            "unwinds/s unwind/chain_unwind",
            s["unwind_ratio"],
            ">= 0.8x",
            s["unwind_ratio"] >= 0.8,
        ),
        ("  lowest round", s["unwind_ratio_low"], "", None),
        ("  highest round", s["unwind_ratio_high"], "", None),
        ("  first hop (failure) / fwd", s["first_ratio"], "", None),
        ("  all reversal hops / fwd", s["reversal_ratio"], "", None),
    )
    for name, ratio, target, ok in lines:
        verdict = "" if ok is None else ("OK" if ok else "MISSED")
        print(
            f"  {name:<28} {ratio:6.2f}x   {('target ' + target) if target else '':<16} {verdict}"
        )


def print_broker(result: dict[str, Any]) -> dict[str, float]:
    s = summary(result)
    _print_latency(result, s)
    _print_throughput(result, s)
    _print_hops(result, s)
    print_counts(result["counts"])
    print_rss(result.get("rss"))
    print_ratios(s)
    if "traced_saga" in result["latency"]:
        import bench_traced

        bench_traced.print_traced(result, s)
    return s


def print_both(results: dict[str, dict[str, Any]]) -> None:
    """One table, a column per broker."""
    summaries = {broker: summary(result) for broker, result in results.items()}
    brokers = list(summaries)
    rows = (
        ("chain latency median / p95 (ms)", "chain_latency_median", "chain_latency_p95"),
        ("saga latency median / p95 (ms)", "saga_latency_median", "saga_latency_p95"),
        ("chain / saga steps/s", "chain_steps_per_s", "saga_steps_per_s"),
        ("unwinds/s", "unwind_runs_per_s", None),
        ("chain_unwind / unwind runs/s", "chain_unwind_runs_per_s", "unwind_runs_per_s"),
        ("unwind ratio (lowest / highest)", "unwind_ratio_low", "unwind_ratio_high"),
        ("  unwind / chain_unwind", "unwind_ratio", None),
        ("CPU ms per run chain_unwind / unwind", "chain_unwind_cpu_per_run", "unwind_cpu_per_run"),
        ("chain hop / forward hop (ms)", "chain_hop", "forward_hop"),
        ("forward hop / reversal hop (ms)", "forward_hop", "later_reversal_hop"),
        ("first hop (failure) / all hops (ms)", "first_reversal_hop", "reversal_hop"),
        ("latency / p95 ratio saga/chain", "latency_ratio", "p95_ratio"),
        ("  forward hop / chain hop", "hop_ratio", None),
        ("throughput ratio saga/chain", "throughput_ratio", None),
        ("  lowest / highest round", "throughput_ratio_low", "throughput_ratio_high"),
        ("reversal hop / forward hop", "later_ratio", None),
        ("  first hop / all hops vs forward", "first_ratio", "reversal_ratio"),
        ("RSS saga, first / last count (MB)", "rss_first_saga", "rss_last_saga"),
        ("RSS unwind, first / last count (MB)", "rss_first_unwind", "rss_last_unwind"),
    )
    print("\n== summary, both brokers")
    print(f"  {'':<34}" + "".join(f"{b:>20}" for b in brokers))
    for label, first, second in rows:
        cells = []
        for broker in brokers:
            s = summaries[broker]
            nan = float("nan")
            cell = f"{s.get(first, nan):.2f}" + (f" / {s.get(second, nan):.2f}" if second else "")
            cells.append(f"{cell:>20}")
        print(f"  {label:<34}" + "".join(cells))
