"""What a run that does not move on its own waits for, in one sentence: a signal at its gate
(until its deadline), a worker that has its version, its child run, or a paused step. ``saga show``,
``saga list``, the web view and the Django admin all say it through ``reason``, so they say
it alike."""

from __future__ import annotations

from collections.abc import Sequence

from celery_saga.definition.nodes import SubSagaNode
from celery_saga.definition.run_markings import FindDefinition
from celery_saga.inspect.values import HoldView, StepView
from celery_saga.records import DoorPlace, ExecutionRecord, ExecutionState, QueuePlace
from celery_saga.runtime.children import child_execution_id


def reason(
    state: str,
    *,
    event: str | None = None,
    until: str | None = None,
    version: str | None = None,
    child: str | None = None,
    held: str | None = None,
    paused: tuple[str, str] | None = None,
    queued: QueuePlace | None = None,
    door: DoorPlace | None = None,
) -> str | None:
    """What a run in ``state`` waits for, or None. ``event``, ``until``: its gate's event and
    deadline (as printed; a held run's: its hold timeout); ``version``: the version a worker
    without it handed the run's message back for (what holds it first); ``child``: the run
    its sub-saga node started; ``held``: the step a held run waits on; ``paused``: the step
    and reason of the pause a held run waits at the door of; ``queued``: a queued run's key,
    and how many of its runs are ahead (-1: not counted); ``door``: a step waiting at a
    limited step's door (``step(concurrency=, rate=)``)."""
    if paused and state == ExecutionState.HELD.value:
        step, why = paused
        return f"held: paused ({why}) at the door of step {step!r}; unpause releases it"
    if state == ExecutionState.QUEUED.value:
        if queued is None:
            return "queued: waiting for a slot of its flow-control key"
        ahead = f", {queued.ahead} ahead" if queued.ahead >= 0 else ""
        return f"queued behind key {queued.key!r}{ahead}"
    if version:
        return f"waiting for version {version}: a worker without it handed its message back"
    if state == ExecutionState.WAITING.value:
        what = f"waiting for signal {event!r}" if event else "waiting for a signal"
        return what + (f" until {until}" if until else " (no deadline)")
    if state == ExecutionState.HELD.value:
        what = f"held at step {held!r}" if held else "held"
        then = f"; unwinds at {until} unless moved" if until else ""
        return f"{what}: waiting for an operator to retry, skip, unwind or cancel it{then}"
    if child and state == ExecutionState.RUNNING.value:
        return f"waiting for child run {child}"
    if door is not None and state == ExecutionState.RUNNING.value:
        if door.turn_at is not None:
            turn = door.turn_at.isoformat(timespec="milliseconds")
            return (
                f"waiting for its turn at {turn} (rate of key {door.key!r}) at step {door.step!r}"
            )
        return f"waiting for a slot of key {door.key!r} at the door of step {door.step!r}"
    return None


def hold_of(record: ExecutionRecord, steps: Sequence[StepView]) -> HoldView | None:
    """What a held run waits on: the failed step at its cursor."""
    if record.state is not ExecutionState.HELD:
        return None
    at = [s for s in steps if s.node == record.cursor and s.status == "failed"]
    if not at:
        return None
    step = at[-1]
    return HoldView(step.name, step.error, step.attempts, record.wake_at)


def running_child(steps: Sequence[StepView], cursor: int) -> str | None:
    """The child run a running sub-saga node at ``cursor`` started, if any."""
    for step in steps:
        if step.node == cursor and step.child is not None and step.status == "running":
            return step.child.id
    return None


def listed(
    record: ExecutionRecord,
    *,
    event: str | None = None,
    version: str | None = None,
    child: str | None = None,
) -> str:
    """The reason column of a listed run (``saga list``, the web view's runs): why it failed
    or parked, else what it waits for (``reason``; its deadline to the second, as the list's
    times), else ""."""
    failed = record.rollback_reason or record.failure_reason
    if failed:
        return failed.replace("\n", " ")
    until = record.wake_at.strftime("%Y-%m-%d %H:%M:%S") if record.wake_at else None
    state = record.state.value
    # a list does not count each queued run's place: one read per row
    queued = QueuePlace(record.flow_key, -1) if record.flow_key is not None else None
    return (
        reason(state, event=event, until=until, version=version, child=child, queued=queued) or ""
    )


def awaited_child(find: FindDefinition, record: ExecutionRecord) -> str | None:
    """The child run a running run stands at (its sub-saga node), from its definition alone:
    the child's id is derived from the parent's and the node's (``runtime.children``)."""
    if record.state is not ExecutionState.RUNNING:
        return None
    definition = find(record.saga_name, record.definition_hash)
    nodes = definition.nodes if definition is not None else ()
    node = nodes[record.cursor] if 0 <= record.cursor < len(nodes) else None
    return child_execution_id(record.id, node.name) if isinstance(node, SubSagaNode) else None
