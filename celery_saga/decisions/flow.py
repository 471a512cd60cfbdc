"""Flow control by key (guarantee 37): may a run take a slot of its key, and how many
queued runs does a slot that frees start?

The store holds each key's count of runs with a slot under a row lock while it applies
these, so two admissions, or an admission and a run that ends, decide one after the other.
"""

from __future__ import annotations

from enum import Enum


class FlowVerdict(str, Enum):
    #: A slot is free: the run starts now and holds it until it ends.
    ADMIT = "admit"
    #: Every slot is held: the run is stored ``queued``.
    QUEUE = "queue"


def admit(live: int, limit: int) -> FlowVerdict:
    """A run's admission when ``live`` runs of its key hold a slot, of ``limit``."""
    return FlowVerdict.ADMIT if live < limit else FlowVerdict.QUEUE


def slots_to_hand_on(live: int, limit: int, queued: int) -> int:
    """How many of ``queued`` runs start once ``live`` runs hold a slot, of ``limit``
    (more than one after the limit was raised; none after it was lowered)."""
    return max(0, min(queued, limit - live))
