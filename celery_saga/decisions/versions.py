"""Which version a run uses, whether a worker runs or hands back its message, and whether an
operator may move a run to another version (guarantee 22).

A version is a definition hash (the graph's shape plus its optional ``version=`` label).
Every decision here is a function of plain data: hashes, labels, node shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: Pauses before a handed-back message is offered again: short at first (a rolling deploy
#: usually has a worker with the version next to this one), then at most 10 s, for as long
#: as it takes a worker with the version to start.
HAND_BACK_COUNTDOWNS = (0.5, 1.0, 2.0, 4.0, 8.0, 10.0)


class Placement(str, Enum):
    RUN = "run"  # this process has the run's version
    HAND_BACK = "hand_back"  # it does not: the message goes back for a worker that has it


@dataclass(frozen=True)
class VersionRef:
    """One registered version: its hash and its label, if any."""

    hash: str
    label: str | None = None


def newest(registered: Sequence[VersionRef]) -> VersionRef | None:
    """The version a new run starts on: the last one this process registered."""
    return registered[-1] if registered else None


def place(run_hash: str, registered: Sequence[VersionRef]) -> Placement:
    """A message of a run that started on ``run_hash`` reaches a process with
    ``registered``: it runs here only on that very version, never on another one."""
    if any(version.hash == run_hash for version in registered):
        return Placement.RUN
    return Placement.HAND_BACK


def hand_back_countdown(times_handed_back: int) -> float:
    """Seconds before the ``times_handed_back``-th hand-back of a message is offered again."""
    index = min(max(times_handed_back, 0), len(HAND_BACK_COUNTDOWNS) - 1)
    return HAND_BACK_COUNTDOWNS[index]


def label_taken(
    label: str | None, version: str, registered: Sequence[VersionRef]
) -> VersionRef | None:
    """The registered version whose ``version=`` label is ``label`` but whose graph is not
    that of version ``version`` (another hash), if any: one label names one graph, or an
    operator's ``--to 2`` or ``--version 2`` would pick one of two versions silently."""
    if label is None:
        return None
    return next((v for v in registered if v.label == label and v.hash != version), None)


def find_version(wanted: str, registered: Sequence[VersionRef]) -> VersionRef | None:
    """The version an operator names: a hash, a unique hash prefix (4 characters or more),
    or a label (the newest version carrying it)."""
    for version in registered:
        if version.hash == wanted:
            return version
    labelled = [v for v in registered if v.label is not None and v.label == wanted]
    if labelled:
        return labelled[-1]
    prefixed = [v for v in registered if len(wanted) >= 4 and v.hash.startswith(wanted)]
    return prefixed[0] if len(prefixed) == 1 else None


@dataclass(frozen=True)
class Upgrade:
    """May a run move to another version? ``node`` names the first node that differs."""

    allowed: bool
    node: str | None = None
    reason: str = ""


def decide_upgrade(
    passed: int, current: Sequence[tuple[str, Any]], target: Sequence[tuple[str, Any]]
) -> Upgrade:
    """A run has reached node index ``passed`` of its version's nodes ``current`` (each a
    (name, shape) pair); it may move to ``target`` only when every node up to and including
    that one is the same, at the same position, in ``target``: its records then mean the
    same there, and its compensations are the same callables."""
    for index in range(min(passed + 1, len(current))):
        name, shape = current[index]
        if index >= len(target):
            return Upgrade(False, name, f"node {name!r} does not exist in the new version")
        if target[index] != (name, shape):
            what = _what_differs(shape, target[index][1])
            return Upgrade(False, name, f"node {name!r} differs in the new version{what}")
    return Upgrade(True)


def _what_differs(shape: Any, other: Any) -> str:
    """For a step that stays a step: which of its callables the new version changes (its
    compensation is what a completed step's unwind would need)."""
    if not (shape[0] == other[0] == "step" and shape[1][0] == other[1][0]):
        return ""
    (_, action, compensation, _), (_, new_action, new_compensation, _) = shape[1], other[1]
    if compensation != new_compensation:
        return f" (its compensation {compensation!r} is {new_compensation!r} there)"
    if action != new_action:
        return f" (its action {action!r} is {new_action!r} there)"
    return ""


class Stranding(str, Enum):
    """What a release does to a run of a version it lacks (``saga versions check``)."""

    MOVABLE = "movable"  # ``upgrade`` moves it to a version the release has
    BLOCKED = "blocked"  # a node it reached differs in every version the release has
    NO_SAGA = "no_saga"  # the release has no version of its saga at all
    NO_SHAPE = "no_shape"  # its version's shape is not in the store: it cannot be judged


@dataclass(frozen=True)
class StrandVerdict:
    """``to``: the version it can move to; ``node`` and ``reason``: why it cannot."""

    kind: Stranding
    to: str | None = None
    node: str | None = None
    reason: str = ""


def judge_stranded(
    passed: int,
    current: Sequence[tuple[str, Any]] | None,
    releases: Sequence[tuple[str, Sequence[tuple[str, Any]]]],
) -> StrandVerdict:
    """A run of a version the release lacks has reached node index ``passed`` of its
    version's nodes ``current`` (None: its shape is not stored). ``releases``: the (hash,
    nodes) of each version of its saga the release has, oldest first. It can move to the
    newest of them whose nodes up to ``passed`` are its own (``decide_upgrade``)."""
    if not releases:
        return StrandVerdict(Stranding.NO_SAGA, reason="this code has no version of its saga")
    if current is None:
        return StrandVerdict(
            Stranding.NO_SHAPE,
            reason="its version's shape is not in the store; no process with that version "
            "has started since the store was upgraded",
        )
    first: Upgrade | None = None
    for version, nodes in reversed(releases):
        verdict = decide_upgrade(passed, current, nodes)
        if verdict.allowed:
            return StrandVerdict(Stranding.MOVABLE, to=version)
        first = first or verdict
    assert first is not None
    return StrandVerdict(Stranding.BLOCKED, node=first.node, reason=first.reason)
