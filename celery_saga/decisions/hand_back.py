"""Whether a worker hands a saga message back instead of running it, and how long the
message stays away first (guarantee 22; a run of another store takes the same way back).

The worker's consumer decides from the message's headers alone, before Celery looks at its
ETA and before any pool process or store is involved: a message for a task this worker
lacks, for a version of a saga it lacks, or of a run that a worker of this store already
found missing. A run missing from the store is told apart from a stale message by the store
the message names (``names_another_store``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from celery_saga.decisions.versions import HAND_BACK_COUNTDOWNS, hand_back_countdown


class HandBackReason(str, Enum):
    UNKNOWN_TASK = "unknown_task"  # the message's task is not registered in this worker
    VERSION_NOT_HERE = "version_not_here"  # the run's version is not registered here
    RUN_NOT_IN_STORE = "run_not_in_store"  # this worker's store does not hold the run


def hand_back_reason(
    *, task_known: bool, version_known: bool | None, absent_here: bool
) -> HandBackReason | None:
    """Why the consumer hands a saga message back, or None when it goes to Celery as usual.
    ``version_known`` is None for a message that names no version (an older release): then
    only the run, read in the pool, can say (``VersionNotDeployedError``)."""
    if not task_known:
        return HandBackReason.UNKNOWN_TASK
    if version_known is False:
        return HandBackReason.VERSION_NOT_HERE
    if absent_here:
        return HandBackReason.RUN_NOT_IN_STORE
    return None


#: A pause is its step of the backoff times a factor drawn in [1 - SPREAD, 1 + SPREAD):
#: workers whose pauses were all equal fell into step with a broker's own rhythm (on Redis
#: an idle worker renews its blocking read every second) and met the same message again
#: and again while a worker that could run it stood idle.
SPREAD = 0.25


def hold_seconds(times_handed_back: int, *, taker_arrived: bool, draw: float) -> float:
    """How long a handed-back message stays away (``draw``: a random number in [0, 1)):
    this hand-back's step of the backoff, spread. While a worker that can take it has just
    arrived, the backoff stays at its first step: the message then reaches that worker after
    a few short hand-backs, not after long ones (a ceiling of 2 s made the last of six runs
    wait 16 to 27 s where the first step gave 8 to 12, tests/test_hand_back_pace.py)."""
    step = HAND_BACK_COUNTDOWNS[0] if taker_arrived else hand_back_countdown(times_handed_back)
    return round(step * (1 - SPREAD + 2 * SPREAD * draw), 2)


@dataclass(frozen=True)
class Wanted:
    """What a handed-back message needs of a worker: its task, the run's saga and version
    (None: not named) and the store the run lives in (None: not named)."""

    task: str
    saga: str | None
    version: str | None
    store: str | None


@dataclass(frozen=True)
class Arrival:
    """A worker that just started: its store, its (saga, version) pairs and its tasks."""

    store: str
    versions: frozenset[tuple[str, str]]
    tasks: frozenset[str]


def can_take(arrival: Arrival, wanted: Wanted) -> bool:
    """Whether the arrived worker can run the message: it has its task and its version, and
    uses the store its run lives in."""
    if wanted.task not in arrival.tasks:
        return False
    if wanted.store is not None and wanted.store != arrival.store:
        return False
    return wanted.version is None or (wanted.saga or "", wanted.version) in arrival.versions


def names_another_store(message_store: str | None, this_store: str) -> bool:
    """Whether a message may be of a run of another store: it names a store, not this one.
    Only such a message makes a worker check that its store holds the run before handling it
    (a run it lacks is handed back for that store's workers); a message of this store whose
    run is gone is stale, and dropped as before. A message of an older release names none."""
    return message_store is not None and message_store != this_store
