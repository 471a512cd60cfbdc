"""Where a run goes next: positions in the node list, pivots, and parallel joins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from celery_saga.definition.nodes import Node, PivotNode
from celery_saga.records import StepRecord, StepStatus


@dataclass(frozen=True)
class Advance:
    """The next position, or ``finished``; ``passes_pivot`` if a pivot lies on the way.
    ``releases_slot``: the run holds a flow-control slot, which its end gives back."""

    node: int
    sub: int
    finished: bool
    passes_pivot: bool
    releases_slot: bool = False


def _skip_pivots(nodes: Sequence[Node], index: int, passed: bool) -> Advance:
    while index < len(nodes) and isinstance(nodes[index], PivotNode):
        index, passed = index + 1, True
    return Advance(index, 0, index >= len(nodes), passed)


def first_position(nodes: Sequence[Node]) -> Advance:
    return _skip_pivots(nodes, 0, False)


def advance(nodes: Sequence[Node], node: int, sub: int, path_length: int = 1) -> Advance:
    """After finishing ``(node, sub)``; ``path_length`` is the chosen branch path's length."""
    if sub + 1 < path_length:
        return Advance(node, sub + 1, False, False)
    return _skip_pivots(nodes, node + 1, False)


@dataclass(frozen=True)
class GroupOutcome:
    settled: bool
    failures: tuple[tuple[str, str], ...]

    @property
    def reason(self) -> str:
        """Every member's failure, not only the first (guarantee 19)."""
        return "; ".join(f"step {name!r} failed: {error}" for name, error in self.failures)


def group_outcome(member_names: Sequence[str], records: Sequence[StepRecord]) -> GroupOutcome:
    """A parallel group is settled once every member completed or failed definitively."""
    by_name = {r.name: r for r in records}
    members = [by_name.get(name) for name in member_names]
    settled = all(
        m is not None and m.status in (StepStatus.COMPLETED, StepStatus.FAILED) for m in members
    )
    failures = tuple(
        (m.name, m.error or "failed")
        for m in members
        if m is not None and m.status is StepStatus.FAILED
    )
    return GroupOutcome(settled, failures)
