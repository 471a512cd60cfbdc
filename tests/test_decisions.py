"""The pure decisions and runtime helpers, exercised with plain data (guarantees 1-6, 8-10,
19, 21): admission, the unwind plan, the cursor, parallel joins, backoff, idempotency keys,
schemas, argument mapping and timeouts."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import celery
import pytest
from billiard.exceptions import SoftTimeLimitExceeded
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from celery_saga import (
    CompensationOutcome,
    ExecutionRecord,
    ExecutionState,
    RollbackStatus,
    SagaContext,
    SchemaValidationError,
    StepRecord,
    StepStatus,
    StepTimeoutError,
)
from celery_saga.decisions.admission import Admission, NodeMessage, decide_admission
from celery_saga.decisions.cursor import Advance, advance, first_position, group_outcome
from celery_saga.decisions.retry import backoff_delay
from celery_saga.decisions.unwind import (
    UnwindKind,
    UnwindStep,
    compensation_admission,
    eligible_steps,
    next_unwind_step,
    outstanding_steps,
)
from celery_saga.definition.nodes import Node, PivotNode, StepNode, StepSpec
from celery_saga.runtime.invoke import apply_schema, call_arguments
from celery_saga.runtime.keys import idempotency_key
from celery_saga.runtime.timeouts import cut_short, run_with_timeout

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
HASH = "abc123"


def execution(**changes: Any) -> ExecutionRecord:
    record = ExecutionRecord(
        id="run-1",
        saga_name="order",
        definition_hash=HASH,
        state=ExecutionState.RUNNING,
        cursor=2,
        cursor_sub=0,
        input={},
        failure_reason=None,
        rollback_status=None,
        rollback_reason=None,
        committed_at=None,
        parent_execution_id=None,
        version=1,
        created_at=NOW,
        updated_at=NOW,
    )
    return replace(record, **changes)


def record(name: str = "charge", id: int = 1, **changes: Any) -> StepRecord:
    base = StepRecord(
        id=id,
        execution_id="run-1",
        name=name,
        node=2,
        sub=0,
        status=StepStatus.COMPLETED,
        attempts=1,
        idempotency_key=f"run-1:{name}:0:forward",
        compensatable=True,
    )
    return replace(base, **changes)


def message(**changes: Any) -> NodeMessage:
    return replace(NodeMessage("run-1", node=2, sub=0, member=0, attempt=1), **changes)


def admit(
    execution_record: ExecutionRecord | None = None,
    step: StepRecord | None = None,
    msg: NodeMessage | None = None,
    deployed: str | None = HASH,
) -> Admission:
    execution_record = execution() if execution_record is None else execution_record
    return decide_admission(execution_record, step, msg or message(), deployed, NOW)


# -- decide_admission (guarantee 10) ---------------------------------------------------


def test_message_for_an_unknown_execution_is_rejected_as_missing() -> None:
    assert decide_admission(None, None, message(), HASH, NOW) is Admission.REJECT_MISSING


@pytest.mark.parametrize("state", [s for s in ExecutionState if s is not ExecutionState.RUNNING])
def test_message_for_a_run_that_is_not_running_is_rejected_as_not_live(
    state: ExecutionState,
) -> None:
    assert admit(execution(state=state)) is Admission.REJECT_NOT_LIVE


@pytest.mark.parametrize("deployed", ["other", None])
def test_message_for_a_run_bound_to_another_version_is_handed_back(
    deployed: str | None,
) -> None:
    assert admit(deployed=deployed) is Admission.HAND_BACK


@pytest.mark.parametrize(("node", "sub"), [(1, 0), (3, 0), (2, 1)])
def test_message_for_another_position_than_the_cursor_is_rejected_as_stale(
    node: int, sub: int
) -> None:
    assert admit(msg=message(node=node, sub=sub)) is Admission.REJECT_STALE_CURSOR


def test_first_message_at_the_cursor_with_no_record_runs() -> None:
    assert admit() is Admission.RUN


@pytest.mark.parametrize("status", [StepStatus.COMPLETED, StepStatus.FAILED])
def test_step_that_already_settled_is_never_run_again(status: StepStatus) -> None:
    assert admit(step=record(status=status)) is Admission.REJECT_ALREADY_DONE


def test_running_step_with_a_live_lease_is_rejected_as_in_flight() -> None:
    held = record(status=StepStatus.RUNNING, lease_expires_at=NOW + timedelta(seconds=1))
    assert admit(step=held) is Admission.REJECT_IN_FLIGHT


@pytest.mark.parametrize("expired", [timedelta(seconds=1), timedelta(days=3)])
def test_running_step_whose_lease_expired_is_admitted_again(expired: timedelta) -> None:
    orphan = record(status=StepStatus.RUNNING, lease_expires_at=NOW - expired)
    assert admit(step=orphan) is Admission.RUN


@given(attempts=st.integers(1, 50), attempt=st.integers(1, 60))
def test_pending_retry_admits_only_the_message_for_exactly_the_next_attempt(
    attempts: int, attempt: int
) -> None:
    pending = record(status=StepStatus.PENDING, attempts=attempts)
    verdict = admit(step=pending, msg=message(attempt=attempt))
    if attempt == attempts + 1:
        assert verdict is Admission.RUN
    else:
        assert verdict is Admission.REJECT_STALE_ATTEMPT


def test_liveness_is_checked_before_the_cursor_and_the_record() -> None:
    done = record(status=StepStatus.COMPLETED)
    stale = message(node=0)
    assert admit(execution(state=ExecutionState.FAILED), done, stale) is Admission.REJECT_NOT_LIVE
    assert admit(execution(), done, stale, "other") is Admission.HAND_BACK
    assert admit(execution(), done, stale) is Admission.REJECT_STALE_CURSOR


# -- the unwind plan (guarantees 1-6, 8) -----------------------------------------------

names = st.lists(st.text("abcdefghij", min_size=1, max_size=6), min_size=1, max_size=8, unique=True)


@st.composite
def started_steps(draw: st.DrawFn) -> list[StepRecord]:
    """Compensatable steps with distinct start ids, finishing in any order, listed in any
    order, some failed."""
    step_names = draw(names)
    ids = draw(
        st.lists(
            st.integers(1, 10_000), min_size=len(step_names), max_size=len(step_names), unique=True
        )
    )
    records = []
    for name, start_id in zip(step_names, ids, strict=True):
        finished = NOW + timedelta(seconds=draw(st.integers(0, 10_000)))
        status = draw(st.sampled_from([StepStatus.COMPLETED, StepStatus.FAILED]))
        records.append(record(name, start_id, status=status, completed_at=finished))
    return draw(st.permutations(records))


def compensate_all(
    records: list[StepRecord],
    committed: bool = False,
) -> tuple[list[str], UnwindStep]:
    """Follow the plan as the unwinder does, recording each reversal as compensated."""
    available = {r.name for r in records}
    order: list[str] = []
    for _ in range(len(records) + 2):
        plan = next_unwind_step(records, committed, available)
        if plan.kind is not UnwindKind.COMPENSATE:
            return order, plan
        assert plan.record is not None
        order.append(plan.record.name)
        records = [
            replace(r, compensation_status=CompensationOutcome.COMPENSATED)
            if r.id == plan.record.id
            else r
            for r in records
        ]
    raise AssertionError(f"unwind did not finish: {order}")


@given(started_steps())
def test_eligible_steps_are_in_reverse_start_order_whatever_the_completion_order(
    records: list[StepRecord],
) -> None:
    ids = [r.id for r in eligible_steps(records, committed=False)]
    assert ids == sorted((r.id for r in records), reverse=True)


@given(started_steps())
def test_unwind_compensates_every_eligible_step_exactly_once_newest_start_first(
    records: list[StepRecord],
) -> None:
    order, plan = compensate_all(records)
    expected = [r.name for r in sorted(records, key=lambda r: r.id, reverse=True)]
    assert order == expected
    assert plan == UnwindStep(UnwindKind.DONE, rollback_status=RollbackStatus.COMPLETED)


def test_failed_step_is_eligible_and_reversed_first_as_the_latest_started() -> None:
    records = [record("reserve", 1), record("charge", 2, status=StepStatus.FAILED)]
    assert [r.name for r in eligible_steps(records, committed=False)] == ["charge", "reserve"]
    plan = next_unwind_step(records, False, {"reserve", "charge"})
    assert plan.kind is UnwindKind.COMPENSATE
    assert plan.record is not None and plan.record.name == "charge"


def test_steps_without_a_compensation_are_not_eligible() -> None:
    records = [record("reserve", 1), record("notify", 2, compensatable=False)]
    assert [r.name for r in eligible_steps(records, committed=False)] == ["reserve"]


@given(started_steps(), st.sampled_from([None, *CompensationOutcome]))
def test_committed_run_has_nothing_eligible_and_rollback_not_applicable(
    records: list[StepRecord],
    outcome: CompensationOutcome | None,
) -> None:
    records = [replace(records[0], compensation_status=outcome), *records[1:]]
    assert eligible_steps(records, committed=True) == []
    assert outstanding_steps(records, committed=True) == []
    assert next_unwind_step(records, True, {r.name for r in records}) == UnwindStep(
        UnwindKind.DONE, rollback_status=RollbackStatus.NOT_APPLICABLE
    )


def test_run_with_no_compensatable_step_is_done_with_rollback_not_applicable() -> None:
    records = [record("notify", 1, compensatable=False)]
    plan = next_unwind_step(records, False, set())
    assert plan == UnwindStep(UnwindKind.DONE, rollback_status=RollbackStatus.NOT_APPLICABLE)
    assert next_unwind_step([], False, set()).rollback_status is RollbackStatus.NOT_APPLICABLE


@pytest.mark.parametrize("settled", [CompensationOutcome.COMPENSATED, CompensationOutcome.SKIPPED])
def test_step_that_already_has_an_outcome_is_never_reversed_again(
    settled: CompensationOutcome,
) -> None:
    records = [record("reserve", 1), record("charge", 2, compensation_status=settled)]
    plan = next_unwind_step(records, False, {"reserve", "charge"})
    assert plan.kind is UnwindKind.COMPENSATE
    assert plan.record is not None and plan.record.name == "reserve"


def test_all_eligible_steps_settled_is_done_with_rollback_completed() -> None:
    records = [
        record("reserve", 1, compensation_status=CompensationOutcome.COMPENSATED),
        record("charge", 2, compensation_status=CompensationOutcome.COMPENSATED),
    ]
    plan = next_unwind_step(records, False, {"reserve", "charge"})
    assert plan == UnwindStep(UnwindKind.DONE, rollback_status=RollbackStatus.COMPLETED)


def test_a_failed_reversal_halts_the_unwind_and_older_steps_keep_no_outcome() -> None:
    failed = record("charge", 2, compensation_status=CompensationOutcome.FAILED)
    records = [
        record("reserve", 1),
        failed,
        record("ship", 3, compensation_status=CompensationOutcome.COMPENSATED),
    ]
    plan = next_unwind_step(records, False, {"reserve", "charge", "ship"})
    assert plan == UnwindStep(UnwindKind.HALT_FAILED, failed)
    assert [r.name for r in outstanding_steps(records, committed=False)] == ["reserve"]


def test_step_whose_compensation_vanished_halts_the_unwind_naming_it() -> None:
    records = [record("reserve", 1), record("charge", 2)]
    plan = next_unwind_step(records, False, {"reserve"})
    assert plan.kind is UnwindKind.HALT_VANISHED
    assert plan.record is not None and plan.record.name == "charge"


@given(started_steps(), st.data())
def test_a_vanished_compensation_is_never_silently_dropped(
    records: list[StepRecord],
    data: st.DataObject,
) -> None:
    vanished = data.draw(st.sets(st.sampled_from([r.name for r in records]), min_size=1))
    available = {r.name for r in records} - vanished
    seen: list[str] = []
    for _ in range(len(records) + 1):
        plan = next_unwind_step(records, False, available)
        assert plan.kind is not UnwindKind.DONE, "unwind finished past a vanished compensation"
        assert plan.record is not None
        if plan.kind is UnwindKind.HALT_VANISHED:
            assert plan.record.name in vanished
            newest_vanished = max((r for r in records if r.name in vanished), key=lambda r: r.id)
            assert plan.record == newest_vanished
            assert all(r.id > plan.record.id for r in records if r.name in seen)
            return
        seen.append(plan.record.name)
        records = [
            replace(r, compensation_status=CompensationOutcome.COMPENSATED)
            if r.id == plan.record.id
            else r
            for r in records
        ]
    raise AssertionError("the unwind never halted")


def test_vanished_compensation_of_an_already_compensated_step_does_not_halt() -> None:
    records = [
        record("reserve", 1),
        record("charge", 2, compensation_status=CompensationOutcome.COMPENSATED),
    ]
    plan = next_unwind_step(records, False, {"reserve"})
    assert plan.kind is UnwindKind.COMPENSATE
    assert plan.record is not None and plan.record.name == "reserve"


# -- compensation_admission ------------------------------------------------------------


def planned_for(step: StepRecord) -> UnwindStep:
    return UnwindStep(UnwindKind.COMPENSATE, step)


def test_compensate_message_for_the_planned_step_and_next_attempt_runs() -> None:
    step = record("charge", 2, compensation_attempts=0)
    assert compensation_admission(step, planned_for(step), 1, lease_live=False) is Admission.RUN


def test_compensate_message_for_a_missing_record_is_rejected() -> None:
    step = record("charge", 2)
    assert compensation_admission(None, planned_for(step), 1, False) is Admission.REJECT_NOT_LIVE


@pytest.mark.parametrize(
    "kind", [UnwindKind.DONE, UnwindKind.HALT_FAILED, UnwindKind.HALT_VANISHED]
)
def test_compensate_message_when_the_plan_is_not_to_compensate_is_rejected(
    kind: UnwindKind,
) -> None:
    step = record("charge", 2)
    plan = UnwindStep(kind, None if kind is UnwindKind.DONE else step)
    assert compensation_admission(step, plan, 1, False) is Admission.REJECT_NOT_LIVE


def test_compensate_message_for_a_step_that_is_not_next_in_reverse_order_is_rejected() -> None:
    older, newer = record("reserve", 1), record("charge", 2)
    verdict = compensation_admission(older, planned_for(newer), 1, False)
    assert verdict is Admission.REJECT_STALE_CURSOR


@pytest.mark.parametrize("outcome", list(CompensationOutcome))
def test_compensate_message_for_a_step_with_an_outcome_is_rejected_as_done(
    outcome: CompensationOutcome,
) -> None:
    step = record("charge", 2, compensation_status=outcome)
    assert (
        compensation_admission(step, planned_for(step), 1, False) is Admission.REJECT_ALREADY_DONE
    )


def test_compensate_message_while_another_worker_holds_the_claim_is_in_flight() -> None:
    step = record("charge", 2, compensation_attempts=1)
    assert compensation_admission(step, planned_for(step), 1, True) is Admission.REJECT_IN_FLIGHT


@given(claimed=st.integers(0, 20), attempt=st.integers(1, 25), lapsed=st.booleans())
def test_compensate_message_runs_only_for_the_attempt_that_is_owed(
    claimed: int, attempt: int, lapsed: bool
) -> None:
    step = record("charge", 2, compensation_attempts=claimed)
    if lapsed:  # claimed once, and the claim expired: its worker died
        step = replace(
            step, compensation_lease_expires_at=datetime(2020, 1, 1, tzinfo=timezone.utc)
        )
    verdict = compensation_admission(step, planned_for(step), attempt, lease_live=False)
    owed = {claimed + 1} | ({claimed} if lapsed else set())
    # Any other attempt is a duplicate that would skip the backoff or the retry budget.
    expected = Admission.RUN if attempt in owed else Admission.REJECT_STALE_ATTEMPT
    assert verdict is expected


# -- cursor: advance / first_position --------------------------------------------------


def spec(name: str) -> StepSpec:
    return StepSpec(name=name, action=len)


S, P = StepNode(spec("s")), PivotNode()


def test_first_position_of_a_saga_starting_with_a_step_is_node_zero() -> None:
    assert first_position([S, P, S]) == Advance(0, 0, False, False)


def test_first_position_skips_a_leading_pivot_and_flags_it() -> None:
    assert first_position([P, S]) == Advance(1, 0, False, True)


def test_advance_to_the_next_step_does_not_flag_a_pivot() -> None:
    assert advance([S, S, P, S], 0, 0) == Advance(1, 0, False, False)


def test_advance_over_a_pivot_skips_it_and_flags_it() -> None:
    assert advance([S, P, S], 0, 0) == Advance(2, 0, False, True)


def test_advance_past_the_last_node_finishes() -> None:
    assert advance([S, S], 1, 0) == Advance(2, 0, True, False)


def test_advance_onto_a_trailing_pivot_finishes_committed() -> None:
    assert advance([S, P], 0, 0) == Advance(2, 0, True, True)


def test_advance_inside_a_branch_path_moves_to_the_next_sub_position() -> None:
    assert advance([S, S, S], 1, 0, path_length=3) == Advance(1, 1, False, False)
    assert advance([S, S, S], 1, 1, path_length=3) == Advance(1, 2, False, False)


def test_advance_from_the_last_step_of_a_branch_path_leaves_the_branch() -> None:
    assert advance([S, S, P, S], 1, 2, path_length=3) == Advance(3, 0, False, True)


@given(st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_advance_never_stops_on_a_pivot_and_flags_exactly_the_pivots_it_crosses(
    is_pivot: list[bool],
    data: st.DataObject,
) -> None:
    nodes: list[Node] = [P if pivot else S for pivot in is_pivot]
    steps_at = [i for i, pivot in enumerate(is_pivot) if not pivot]
    assume(steps_at)
    here = data.draw(st.sampled_from(steps_at))
    moved = advance(nodes, here, 0)
    later_steps = [i for i in steps_at if i > here]
    assert moved.finished == (not later_steps)
    target = later_steps[0] if later_steps else len(nodes)
    assert moved.node == target and moved.sub == 0
    assert moved.passes_pivot == any(is_pivot[here + 1 : target])


# -- group_outcome ---------------------------------------------------------------------

member_status = st.sampled_from([None, *StepStatus])


@given(st.lists(member_status, min_size=1, max_size=6))
def test_group_is_settled_only_when_every_member_completed_or_failed(
    statuses: list[StepStatus | None],
) -> None:
    members = [f"m{i}" for i in range(len(statuses))]
    records = [
        record(name, i + 1, status=status, error=f"boom {i}")
        for i, (name, status) in enumerate(zip(members, statuses, strict=True))
        if status
    ]
    outcome = group_outcome(members, records)
    settled = all(s in (StepStatus.COMPLETED, StepStatus.FAILED) for s in statuses)
    assert outcome.settled == settled
    failed = [name for name, s in zip(members, statuses, strict=True) if s is StepStatus.FAILED]
    assert [name for name, _ in outcome.failures] == failed
    for name in failed:
        assert f"step {name!r} failed: boom {name[1:]}" in outcome.reason


def test_group_failure_reason_names_every_failed_member_not_only_the_first() -> None:
    records = [
        record("pack", 1, status=StepStatus.FAILED, error="ValueError: no box"),
        record("label", 2, status=StepStatus.COMPLETED),
        record("weigh", 3, status=StepStatus.FAILED, error="IOError: scale offline"),
    ]
    outcome = group_outcome(["pack", "label", "weigh"], records)
    assert outcome.settled
    assert outcome.reason == (
        "step 'pack' failed: ValueError: no box; step 'weigh' failed: IOError: scale offline"
    )


def test_records_of_steps_outside_the_group_are_ignored() -> None:
    records = [record("charge", 1, status=StepStatus.FAILED, error="x"), record("pack", 2)]
    outcome = group_outcome(["pack"], records)
    assert outcome.settled and outcome.failures == ()


# -- backoff_delay ---------------------------------------------------------------------


@given(st.integers(1, 40), st.floats(0.01, 10), st.floats(0.01, 1000))
def test_backoff_without_jitter_is_exponential_and_capped(
    attempt: int,
    base: float,
    cap: float,
) -> None:
    assert backoff_delay(attempt, base, cap, 0.0) == pytest.approx(
        min(base * 2 ** (attempt - 1), cap)
    )


@given(st.integers(1, 30), st.floats(0.01, 10))
def test_backoff_doubles_per_attempt_until_the_cap(attempt: int, base: float) -> None:
    cap = 1e12
    assert backoff_delay(attempt + 1, base, cap, 0.0) == pytest.approx(
        2 * backoff_delay(attempt, base, cap, 0.0)
    )


@given(
    st.integers(1, 1000),
    st.floats(0.01, 10),
    st.floats(0.01, 1000),
    st.floats(0, 1, exclude_max=True),
)
def test_backoff_jitter_adds_at_most_half_of_the_capped_delay(
    attempt: int,
    base: float,
    cap: float,
    fraction: float,
) -> None:
    plain = backoff_delay(attempt, base, cap, 0.0)
    jittered = backoff_delay(attempt, base, cap, fraction)
    assert plain <= jittered < plain * 1.5 or jittered == pytest.approx(plain * 1.5)
    assert jittered == pytest.approx(plain * (1 + 0.5 * fraction))


def test_backoff_stays_capped_for_a_very_high_attempt_number() -> None:
    assert backoff_delay(1100, 0.5, 30.0, 0.0) == 30.0


# -- idempotency_key (guarantee 9) -----------------------------------------------------

directions = st.sampled_from(["forward", "compensate"])


@given(st.uuids().map(str), st.text(min_size=1), st.integers(0, 1000), directions)
def test_key_is_a_function_of_run_step_occurrence_and_direction_only(
    run: str,
    step: str,
    occurrence: int,
    direction: Any,
) -> None:
    # The attempt number is not an input, so every retry and resume sees the same key.
    assert idempotency_key(run, step, occurrence, direction) == idempotency_key(
        run, step, occurrence, direction
    )


@given(
    st.tuples(st.uuids().map(str), st.text(min_size=1), st.integers(0, 50), directions),
    st.tuples(st.uuids().map(str), st.text(min_size=1), st.integers(0, 50), directions),
)
def test_keys_differ_whenever_run_step_occurrence_or_direction_differ(
    one: tuple[Any, ...],
    other: tuple[Any, ...],
) -> None:
    assume(one != other)
    assert idempotency_key(*one) != idempotency_key(*other)


def test_key_differs_between_runs_steps_and_directions() -> None:
    base = idempotency_key("run-1", "charge", 0, "forward")
    assert base == idempotency_key("run-1", "charge", 0, "forward")
    assert base != idempotency_key("run-2", "charge", 0, "forward")
    assert base != idempotency_key("run-1", "refund", 0, "forward")
    assert base != idempotency_key("run-1", "charge", 1, "forward")
    assert base != idempotency_key("run-1", "charge", 0, "compensate")


@pytest.mark.parametrize("step", ["charge", "42:charge", "charge:extra"])
def test_key_parses_back_to_its_parts_when_the_execution_id_has_no_colon(step: str) -> None:
    # SagaEngine.start refuses execution ids containing ':', so the first field is the run,
    # the last two are occurrence and direction, and the step is what lies between.
    key = idempotency_key("order-42", step, 3, "compensate")
    execution_id, rest = key.split(":", 1)
    name, occurrence, direction = rest.rsplit(":", 2)
    assert (execution_id, name, occurrence, direction) == ("order-42", step, "3", "compensate")


# -- apply_schema (guarantee 21) -------------------------------------------------------


class Order(BaseModel):
    amount: int
    currency: str = "EUR"


def test_pydantic_model_schema_returns_the_validated_model_with_defaults_and_coercion() -> None:
    validated = apply_schema(Order, {"amount": "5"}, "input of step 'charge'")
    assert validated == Order(amount=5, currency="EUR")
    assert isinstance(validated.amount, int)


def test_pydantic_type_adapter_schema_returns_the_coerced_value() -> None:
    assert apply_schema(TypeAdapter(list[int]), ["1", 2], "output of step 'count'") == [1, 2]


class Validates:
    def validate(self, value: dict[str, Any]) -> dict[str, Any]:
        if "amount" not in value:
            raise ValueError("amount is required")
        return {**value, "amount": int(value["amount"]), "checked": True}


class Parses:
    @staticmethod
    def parse(value: str) -> int:
        return int(value)


def test_object_with_validate_method_supplies_the_value_it_returns() -> None:
    result = apply_schema(Validates(), {"amount": "7"}, "input of step 'charge'")
    assert result == {"amount": 7, "checked": True}


def test_object_with_parse_method_supplies_the_value_it_returns() -> None:
    assert apply_schema(Parses(), "12", "input of step 'charge'") == 12


def test_plain_callable_schema_supplies_the_value_it_returns() -> None:
    assert apply_schema(lambda v: {**v, "tax": 1}, {"a": 1}, "x") == {"a": 1, "tax": 1}


def test_callable_schema_returning_none_only_asserts_and_keeps_the_original() -> None:
    original = {"amount": 3}
    assert apply_schema(lambda v: None, original, "input of step 'charge'") is original


@pytest.mark.parametrize("falsy", [0, "", [], False])
def test_callable_schema_returning_a_falsy_value_still_replaces_the_original(falsy: Any) -> None:
    assert apply_schema(lambda v: falsy, {"amount": 3}, "output of step 'charge'") == falsy


def test_no_schema_keeps_the_value() -> None:
    value = {"amount": "5"}
    assert apply_schema(None, value, "input of step 'charge'") is value


def raise_type_error(value: Any) -> None:
    raise TypeError("not an order")


@pytest.mark.parametrize(
    "schema",
    [Order, Validates(), TypeAdapter(int), raise_type_error],
    ids=["pydantic-model", "validate-object", "type-adapter", "callable"],
)
def test_rejected_value_raises_schema_validation_error_naming_the_step(schema: Any) -> None:
    with pytest.raises(SchemaValidationError) as caught:
        apply_schema(schema, {"nothing": "useful"}, "input of step 'charge' of saga 'order'")
    message = str(caught.value)
    assert "input of step 'charge' of saga 'order'" in message
    assert "rejected" in message
    assert caught.value.__cause__ is not None
    assert type(caught.value.__cause__).__name__ in message


# -- call_arguments --------------------------------------------------------------------


def context(saga_input: Any = None, **changes: Any) -> SagaContext:
    ctx = SagaContext(
        execution_id="run-1",
        saga_name="order",
        step_name="charge",
        input={"amount": 5, "currency": "USD", "note": "gift"}
        if saga_input is None
        else saga_input,
        results={},
        idempotency_key="run-1:charge:0:forward",
        attempt=1,
    )
    return replace(ctx, **changes)


def pay(amount: int, currency: str = "EUR") -> str:
    return f"{amount} {currency}"


def test_only_the_input_keys_the_function_accepts_are_passed() -> None:
    assert call_arguments(pay, context(), None) == {"amount": 5, "currency": "USD"}


def test_function_with_var_keyword_receives_every_input_key() -> None:
    def anything(**fields: Any) -> None:
        return None

    assert call_arguments(anything, context(), None) == {
        "amount": 5,
        "currency": "USD",
        "note": "gift",
    }


def test_function_accepting_no_input_key_gets_no_arguments() -> None:
    def nothing(other: int = 0) -> None:
        return None

    assert call_arguments(nothing, context(), None) == {}


@pytest.fixture
def app() -> celery.Celery:
    return celery.Celery("t", set_as_current=False)


def test_celery_task_gets_only_the_input_keys_its_body_accepts(app: celery.Celery) -> None:
    @app.task(name="t.pay_task", shared=False)
    def pay_task(amount: int) -> int:
        return amount

    @app.task(name="t.bound_pay", bind=True, shared=False)
    def bound_pay(self: Any, amount: int, currency: str) -> str:
        return currency

    assert call_arguments(pay_task, context(), None) == {"amount": 5}
    assert call_arguments(bound_pay, context(), None) == {"amount": 5, "currency": "USD"}


def test_celery_task_asking_for_ctx_receives_the_context(app: celery.Celery) -> None:
    @app.task(name="t.ctx_task", shared=False)
    def ctx_task(ctx: Any) -> None:
        return None

    ctx = context()
    assert call_arguments(ctx_task, ctx, None) == {"ctx": ctx}


@pytest.mark.parametrize("parameter", ["ctx", "context"])
def test_parameter_named_ctx_or_context_receives_the_context(parameter: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def step({parameter}, amount=None):\n    return None", namespace)
    ctx = context()
    assert call_arguments(namespace["step"], ctx, None) == {parameter: ctx}


def test_parameter_annotated_saga_context_receives_the_context() -> None:
    def step(run: SagaContext) -> None:
        return None

    ctx = context()
    assert call_arguments(step, ctx, None) == {"run": ctx}


def test_explicit_mapper_wins_over_input_keys_and_context() -> None:
    def wants_ctx(ctx: Any, amount: int = 0) -> None:
        return None

    ctx = context()
    mapped = call_arguments(wants_ctx, ctx, lambda c: {"amount": c.input["amount"] * 100})
    assert mapped == {"amount": 500}


@pytest.mark.parametrize("returned", [None, ["amount"], 5, "amount"])
def test_mapper_returning_a_non_mapping_raises_naming_the_step(returned: Any) -> None:
    with pytest.raises(TypeError) as caught:
        call_arguments(pay, context(), lambda c: returned)
    assert "'charge'" in str(caught.value)


def test_pydantic_input_is_mapped_by_its_fields() -> None:
    ctx = context(Order(amount=9, currency="GBP"))
    assert call_arguments(pay, ctx, None) == {"amount": 9, "currency": "GBP"}


def test_non_mapping_input_maps_to_no_arguments() -> None:
    assert call_arguments(pay, context([1, 2, 3]), None) == {}


def test_extra_values_are_offered_alongside_the_input() -> None:
    def refund(amount: int, result: Any) -> None:
        return None

    assert call_arguments(refund, context(), None, extra={"result": "tx-1"}) == {
        "amount": 5,
        "result": "tx-1",
    }


# -- run_with_timeout ------------------------------------------------------------------


def test_hung_function_raises_step_timeout_error_naming_it() -> None:
    release = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(StepTimeoutError) as caught:
            run_with_timeout(lambda: release.wait(30), 0.2, "step 'charge' of saga 'order'")
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert "step 'charge' of saga 'order'" in str(caught.value)
    assert "0.2" in str(caught.value)


def test_function_finishing_within_the_timeout_returns_its_value() -> None:
    assert run_with_timeout(lambda: 42, 5, "step 'charge'") == 42


def test_function_error_within_the_timeout_is_raised_unchanged() -> None:
    boom = ValueError("declined")

    def fail() -> None:
        raise boom

    with pytest.raises(ValueError) as caught:
        run_with_timeout(fail, 5, "step 'charge'")
    assert caught.value is boom


def test_no_timeout_runs_the_function_in_the_calling_thread() -> None:
    assert run_with_timeout(threading.get_ident, None, "x") == threading.get_ident()


def test_a_stop_is_recognised_through_the_errors_raised_while_unwinding_from_it() -> None:
    """The cancel's stop (the soft limit's signal) landing inside a query: the rollback of
    the busy connection raises another error from it (SQLAlchemy's ``OperationalError``,
    "another command is already in progress"), which is what leaves the body; its task
    must still end as the revoke left it (tests/test_flower.py), not as that failure."""

    def wrapped(explicit: bool) -> BaseException:
        try:
            try:
                raise SoftTimeLimitExceeded()
            except SoftTimeLimitExceeded:
                try:
                    raise OSError("another command is already in progress")
                except OSError as driver:
                    if explicit:
                        raise RuntimeError("(OperationalError) rollback failed") from driver
                    raise RuntimeError("cleanup failed") from None
        except RuntimeError as error:
            return error
        raise AssertionError("unreachable")

    assert cut_short(SoftTimeLimitExceeded())
    assert cut_short(StepTimeoutError("step 'charge' timed out after 5s"))
    assert cut_short(wrapped(explicit=True))  # cause -> context -> the stop
    assert cut_short(wrapped(explicit=False))  # ``from None`` keeps the context all the same
    assert not cut_short(ValueError("declined"))
    looped = ValueError("a cycle")
    looped.__context__ = KeyError("back")
    looped.__context__.__context__ = looped
    assert not cut_short(looped)
