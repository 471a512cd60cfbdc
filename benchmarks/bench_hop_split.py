"""Where a hop's time goes: ``chain_vs_saga.py --profile`` splits each hop of the single runs.

A hop runs from one node's outcome write to the next one's (the step's ``completed_at``, a
reversal's ``compensated_at`` are stamped in that write). ``bench_profile`` stamps, on the
host's clock, each task's start and the first call and last return of its claim, its
outcome write and its publish; two consecutive tasks of one run give the hop in six parts:

- ``outcome write``: the first task's outcome statement (with the decision it carries);
- ``events, publish``: from that write to the next message being handed to the broker;
- ``delivery``: the broker, the worker's main process and the pool's pipe, until the next
  task starts (``task_prerun``) in either pool process;
- ``to the claim``: the step wrapper, admission, the connection checkout;
- ``claim``: the claim statement and turning what it returns into records;
- ``to the outcome``: the context, the body, the task's events, up to the outcome write.
"""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import Any

from sqlalchemy import text

#: (kind of both tasks) -> the hop's label.
PAIRS = {
    ("saga", "saga"): "forward",
    ("unwind-fwd", "unwind-fwd"): "forward (unwinding)",
    ("reversal", "reversal"): "reversal",
}
#: Each part: (label, (task, stamp) where it starts, (task, stamp) where it ends).
PARTS = (
    ("outcome write", ("a", "t_record_in"), ("a", "t_record_out")),
    ("events, publish", ("a", "t_record_out"), ("a", "t_publish_out")),
    ("delivery", ("a", "t_publish_out"), ("b", "t_start")),
    ("to the claim", ("b", "t_start"), ("b", "t_claim_in")),
    ("claim", ("b", "t_claim_in"), ("b", "t_claim_out")),
    ("to the outcome", ("b", "t_claim_out"), ("b", "t_record_in")),
)
#: The stamps a hop needs of the task it leaves and of the task it reaches.
LEAVES = ("t_record_in", "t_record_out", "t_publish_out")
REACHES = ("t_start", "t_claim_in", "t_claim_out", "t_record_in")
STAMPS = tuple(dict.fromkeys((*LEAVES, *REACHES)))


def split(connection: Any, start: float, end: float) -> dict[str, dict[str, list[float]]]:
    """Per hop label, per part (and ``hop``): milliseconds of every hop between two
    consecutive profiled tasks of one run recorded between ``start`` and ``end``."""
    found = connection.execute(
        text(
            f"SELECT kind, run_id, {', '.join(STAMPS)} FROM bench_profile "
            "WHERE run_id IS NOT NULL AND ts BETWEEN :a AND :b ORDER BY run_id, t_start"
        ),
        {"a": start, "b": end},
    ).mappings()
    by_run: dict[str, list[Any]] = {}
    for row in found:
        by_run.setdefault(row["run_id"], []).append(row)
    result: dict[str, dict[str, list[float]]] = {label: {} for label in PAIRS.values()}
    for tasks in by_run.values():
        for a, b in pairwise(tasks):
            label = PAIRS.get((a["kind"], b["kind"]))
            missing = any(a[s] is None for s in LEAVES) or any(b[s] is None for s in REACHES)
            if label is None or missing:
                continue
            task = {"a": a, "b": b}
            parts = result[label]
            for name, (t0, s0), (t1, s1) in PARTS:
                parts.setdefault(name, []).append((task[t1][s1] - task[t0][s0]) * 1000)
            parts.setdefault("hop", []).append((b["t_record_in"] - a["t_record_in"]) * 1000)
    return result


def report(parts: dict[str, dict[str, list[float]]]) -> list[str]:
    """Median of each part per hop label, and the reversal's difference to a forward hop."""
    labels = [label for label in PAIRS.values() if parts.get(label)]
    lines = [
        f"  {'part (median ms)':<18}"
        + "".join(f"{label:>21}" for label in labels)
        + f"{'reversal - forward':>20}"
    ]
    for name in (*(part[0] for part in PARTS), "hop"):
        medians = {label: statistics.median(parts[label][name]) for label in labels}
        row = f"  {name:<18}" + "".join(f"{medians[label]:21.3f}" for label in labels)
        if "reversal" in medians and "forward" in medians:
            row += f"{medians['reversal'] - medians['forward']:+20.3f}"
        lines.append(row)
    counts = ", ".join(f"{label} {len(parts[label]['hop'])}" for label in labels)
    lines.append(f"  (hops: {counts}; parts are medians, so they need not add up to the hop)")
    return lines
