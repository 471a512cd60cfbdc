"""Guarantee 22, the pure decisions: which version a run uses, whether a worker runs or hands
back a message, and whether an operator may move a run to another version."""

from __future__ import annotations

import pytest

from celery_saga import Saga
from celery_saga.decisions.versions import (
    HAND_BACK_COUNTDOWNS,
    Placement,
    Stranding,
    VersionRef,
    decide_upgrade,
    find_version,
    hand_back_countdown,
    judge_stranded,
    label_taken,
    newest,
    place,
)
from celery_saga.definition.hashing import node_shape
from celery_saga.definition.nodes import node_name
from celery_saga.definition.shapes import shape_of

V1, V2, V3 = VersionRef("aaaa1111", "1"), VersionRef("bbbb2222", "2"), VersionRef("cccc3333")


def test_a_new_run_starts_on_the_version_registered_last() -> None:
    assert newest([V1, V2]) == V2
    assert newest([V2, V1]) == V1
    assert newest([]) is None


def test_a_message_runs_only_where_its_own_version_is_registered() -> None:
    assert place(V1.hash, [V1, V2]) is Placement.RUN
    assert place(V1.hash, [V2]) is Placement.HAND_BACK, "never run on another version"
    assert place(V1.hash, []) is Placement.HAND_BACK


def test_hand_backs_back_off_up_to_a_ceiling() -> None:
    waits = [hand_back_countdown(n) for n in range(20)]
    assert waits == sorted(waits)
    assert waits[0] < 1 and waits[-1] == HAND_BACK_COUNTDOWNS[-1] == 10.0
    assert hand_back_countdown(-3) == waits[0]


def test_a_label_already_naming_another_graph_is_taken() -> None:
    assert label_taken("2", "dddd4444", [V1, V2, V3]) == V2
    assert label_taken("2", V2.hash, [V1, V2, V3]) is None, "the same graph again"
    assert label_taken("4", "dddd4444", [V1, V2, V3]) is None, "a new label"
    assert label_taken(None, "dddd4444", [V1, V2, V3]) is None, "no label: the hash tells"


def test_an_operator_names_a_version_by_hash_prefix_or_label() -> None:
    registered = [V1, V2, V3]
    assert find_version("bbbb2222", registered) == V2
    assert find_version("2", registered) == V2
    assert find_version("cccc", registered) == V3
    assert find_version("ccc", registered) is None, "prefixes of at least 4 characters"
    assert find_version("zzzz", registered) is None


def _shapes(saga: Saga) -> list[tuple[str, object]]:
    return [(node_name(n), node_shape(n)) for n in saga.seal().nodes]


def one(_: object = None) -> None: ...


def two(_: object = None) -> None: ...


def _v1() -> Saga:
    return Saga("order").step("reserve", one, compensate=two).wait_for("approved").step("ship", one)


def test_a_run_may_move_when_every_node_it_reached_is_unchanged() -> None:
    v2 = Saga("order").step("reserve", one, compensate=two).wait_for("approved").step("send", two)
    verdict = decide_upgrade(1, _shapes(_v1()), _shapes(v2))  # parked on the wait
    assert verdict.allowed and verdict.node is None


def test_a_run_may_not_move_past_a_node_that_differs_and_the_node_is_named() -> None:
    v2 = Saga("order").step("reserve", two, compensate=two).wait_for("approved").step("ship", one)
    verdict = decide_upgrade(1, _shapes(_v1()), _shapes(v2))
    assert not verdict.allowed
    assert verdict.node == "reserve"
    assert "reserve" in verdict.reason


@pytest.mark.parametrize("cursor", [0, 1, 2])
def test_a_node_missing_from_the_target_refuses_the_move(cursor: int) -> None:
    shorter = Saga("order").step("reserve", one, compensate=two)
    verdict = decide_upgrade(cursor, _shapes(_v1()), _shapes(shorter))
    assert verdict.allowed is (cursor == 0)
    if cursor:
        assert verdict.node == "wait_for('approved')"


def test_the_version_label_tells_apart_versions_of_the_same_shape() -> None:
    plain = Saga("order").step("reserve", one).seal()
    labelled = Saga("order", version="2").step("reserve", one).seal()
    assert labelled.label == "2"
    assert plain.hash != labelled.hash
    assert plain.hash == Saga("order").step("reserve", one).seal().hash, "unlabelled: as before"


def _stored(saga: Saga) -> tuple[tuple[str, object], ...]:
    return shape_of(saga.seal()).nodes


def test_a_stranded_run_can_move_to_the_newest_release_version_its_reached_nodes_match() -> None:
    same_start = Saga("order", version="2").step("reserve", one, compensate=two)
    changed = Saga("order", version="3").step("reserve", two, compensate=two)
    releases = [("h2", _stored(same_start)), ("h3", _stored(changed))]
    verdict = judge_stranded(0, _stored(_v1()), releases)
    assert (verdict.kind, verdict.to) == (Stranding.MOVABLE, "h2"), "an older one that fits"
    assert judge_stranded(0, _stored(_v1()), releases[:1]).to == "h2"


def test_a_stranded_run_whose_completed_steps_compensation_is_gone_cannot_move() -> None:
    other_undo = Saga("order", version="2").step("reserve", one, compensate=one)
    verdict = judge_stranded(1, _stored(_v1()), [("h2", _stored(other_undo))])
    assert (verdict.kind, verdict.node) == (Stranding.BLOCKED, "reserve")
    assert "its compensation 'two' is 'one' there" in verdict.reason


def test_a_stranded_run_without_its_shape_or_its_saga_is_named_not_judged() -> None:
    assert judge_stranded(0, None, [("h2", _stored(_v1()))]).kind is Stranding.NO_SHAPE
    assert judge_stranded(0, _stored(_v1()), []).kind is Stranding.NO_SAGA
