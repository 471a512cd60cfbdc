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
    *, task_known: bool, version_known: bool | None, absent_here: bool, times_handed_back: int = 0
) -> HandBackReason | None:
    """Why the consumer hands a saga message back, or None when it goes to Celery as usual.
    ``version_known`` is None for a message that names no version (an older release): then
    only the run, read in the pool, can say (``VersionNotDeployedError``). A run found
    absent here whose message has been handed back ``ABSENT_HAND_BACKS`` times goes to the
    pool too, which reads the store once more and drops it if the run is still absent."""
    if not task_known:
        return HandBackReason.UNKNOWN_TASK
    if version_known is False:
        return HandBackReason.VERSION_NOT_HERE
    if absent_here and not gives_up_on_absent_run(times_handed_back):
        return HandBackReason.RUN_NOT_IN_STORE
    return None


#: How many hand-backs a message of a run absent from a worker's store gets before that
#: worker drops it (about 4.5 minutes of backoff): the same store reached under another
#: URL (a host alias, PgBouncer) has another name, so a stale message of a deleted run
#: would otherwise be handed back for ever. A run that another store does hold is sent
#: again by that store's recovery sweep, as for any lost message.
ABSENT_HAND_BACKS = 30


def gives_up_on_absent_run(times_handed_back: int) -> bool:
    """Whether a message whose run is absent from this worker's store is dropped as stale
    instead of handed back once more."""
    return times_handed_back >= ABSENT_HAND_BACKS


def raises_window(raised_already: int, prefetch: int) -> bool:
    """Whether a consumer keeping a message it cannot run raises its prefetch window by one
    for it (as Celery does for a task with an ETA), with ``raised_already`` of its kept
    messages raising it now and ``prefetch`` its window without them. Up to ``prefetch``
    it does, so its own work goes on; beyond, a kept message takes one of the consumer's
    own slots, and a consumer whose slots are all kept fetches nothing more until one goes
    back: it keeps at most twice its window, and the rest of the queue stays with the
    other workers (tests/test_hand_back_broker.py)."""
    return raised_already < max(prefetch, 1)


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
