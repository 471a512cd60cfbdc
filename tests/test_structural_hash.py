"""Guarantee 22: a run is bound to the structural hash of its definition.

The hash must move whenever the graph that interprets a stored run moves (steps, their order,
names, which callables run, whether a step has a compensation, branch paths), and must stay put
when only tuning changes (retries, timeouts, backoff), so tuning does not orphan live runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celery_saga import Saga, SagaError, path, step
from celery_saga.definition.hashing import hash_of_text, structural_hash
from celery_saga.definition.nodes import node_name
from celery_saga.definition.shapes import read_shape, shape_of

ROOT = Path(__file__).resolve().parent.parent


def reserve(ctx: Any) -> str:
    return "reserved"


def release(ctx: Any) -> None:
    return None


def charge(ctx: Any) -> str:
    return "charged"


def refund(ctx: Any) -> None:
    return None


def void(ctx: Any) -> None:
    return None


def ship(ctx: Any) -> str:
    return "shipped"


def notify(ctx: Any) -> str:
    return "notified"


def route(ctx: Any) -> str:
    return "express"


def other_route(ctx: Any) -> str:
    return "standard"


def build(**change: Any) -> Saga:
    """The reference saga; keyword arguments tweak one aspect of it."""
    tuning = change.get("tuning", {})
    paths = change.get(
        "paths",
        (
            path("express", step("courier", ship, compensate=refund, **tuning)),
            path("standard", step("post", ship), step("track", notify)),
        ),
    )
    saga = Saga(change.get("name", "order"))
    for name, action, compensation in change.get(
        "steps", [("reserve", reserve, release), ("charge", charge, refund)]
    ):
        saga.step(name, action, compensate=compensation, **tuning)
    saga.parallel(
        change.get("group", "prepare"),
        *change.get("members", [step("pack", ship, **tuning), step("label", notify, **tuning)]),
    )
    saga.branch(change.get("branch", "delivery"), change.get("selector", route), *paths)
    if change.get("pivot", True):
        saga.pivot()
    saga.step("notify", notify, **tuning)
    return saga


def hash_of(saga: Saga) -> str:
    return saga.seal().hash


REFERENCE = hash_of(build())


def test_identical_graphs_built_twice_have_the_same_hash() -> None:
    assert hash_of(build()) == hash_of(build()) == REFERENCE


def test_sealed_hash_is_the_structural_hash_of_its_nodes() -> None:
    definition = build().seal()
    assert definition.hash == structural_hash(definition.name, definition.nodes)


def test_hash_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = "from tests.test_structural_hash import build; print(build().seal().hash)"
    for seed in ("1", "2", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == REFERENCE


STRUCTURAL_CHANGES: dict[str, Callable[[], Saga]] = {
    "saga renamed": lambda: build(name="order2"),
    "step added": lambda: build(
        steps=[("reserve", reserve, release), ("charge", charge, refund), ("extra", void, None)]
    ),
    "step removed": lambda: build(steps=[("charge", charge, refund)]),
    "step renamed": lambda: build(steps=[("hold", reserve, release), ("charge", charge, refund)]),
    "steps reordered": lambda: build(
        steps=[("charge", charge, refund), ("reserve", reserve, release)]
    ),
    "action replaced": lambda: build(
        steps=[("reserve", notify, release), ("charge", charge, refund)]
    ),
    "compensation removed": lambda: build(
        steps=[("reserve", reserve, None), ("charge", charge, refund)]
    ),
    "compensation added": lambda: build(
        steps=[("reserve", reserve, release), ("charge", charge, refund)],
        members=[step("pack", ship, compensate=void), step("label", notify)],
    ),
    "compensation replaced": lambda: build(
        steps=[("reserve", reserve, release), ("charge", charge, void)]
    ),
    "parallel member added": lambda: build(
        members=[step("pack", ship), step("label", notify), step("weigh", notify)]
    ),
    "parallel members reordered": lambda: build(
        members=[step("label", notify), step("pack", ship)]
    ),
    "parallel group renamed": lambda: build(group="prepare2"),
    "branch renamed": lambda: build(branch="delivery2"),
    "branch path renamed": lambda: build(
        paths=(
            path("courier", step("courier", ship, compensate=refund)),
            path("standard", step("post", ship), step("track", notify)),
        )
    ),
    "branch path added": lambda: build(
        paths=(
            path("express", step("courier", ship, compensate=refund)),
            path("standard", step("post", ship), step("track", notify)),
            path("pickup", step("counter", notify)),
        )
    ),
    "branch path removed": lambda: build(
        paths=(path("express", step("courier", ship, compensate=refund)),)
    ),
    "branch path step added": lambda: build(
        paths=(
            path("express", step("courier", ship, compensate=refund)),
            path("standard", step("post", ship), step("track", notify), step("sign", notify)),
        )
    ),
    "branch path steps reordered": lambda: build(
        paths=(
            path("express", step("courier", ship, compensate=refund)),
            path("standard", step("track", notify), step("post", ship)),
        )
    ),
    "branch path compensation removed": lambda: build(
        paths=(
            path("express", step("courier", ship)),
            path("standard", step("post", ship), step("track", notify)),
        )
    ),
    "pivot removed": lambda: build(pivot=False),
}


@pytest.mark.parametrize("change", list(STRUCTURAL_CHANGES), ids=list(STRUCTURAL_CHANGES))
def test_structural_change_changes_the_hash(change: str) -> None:
    assert hash_of(STRUCTURAL_CHANGES[change]()) != REFERENCE


def test_every_structural_change_gives_a_distinct_hash() -> None:
    hashes = {name: hash_of(make()) for name, make in STRUCTURAL_CHANGES.items()}
    assert len(set(hashes.values())) == len(hashes)


def test_moving_the_pivot_changes_the_hash() -> None:
    before = Saga("order").step("a", reserve).pivot().step("b", charge)
    after = Saga("order").step("a", reserve).step("b", charge).pivot()
    assert hash_of(before) != hash_of(after)


def test_map_transform_and_step_with_the_same_callable_hash_differently() -> None:
    as_step = Saga("order").step("a", reserve).step("total", charge)
    as_map = Saga("order").step("a", reserve).map("total", charge)
    assert hash_of(as_step) != hash_of(as_map)


TUNING = [
    {"retry": 5},
    {"compensation_retry": 9},
    {"timeout": 3.5},
    {"compensation_timeout": 120},
    {"backoff": 2.0, "backoff_max": 600.0},
    {"retry": 2, "timeout": 1, "compensation_retry": 1, "compensation_timeout": 1},
]


@pytest.mark.parametrize("tuning", TUNING, ids=[",".join(t) for t in TUNING])
def test_changing_only_retries_timeouts_or_backoff_keeps_the_hash(tuning: dict[str, Any]) -> None:
    assert hash_of(build(tuning=tuning)) == REFERENCE


def test_changing_the_branch_selector_keeps_the_hash() -> None:
    # The chosen path is journaled by name (guarantee 12), so the selector is not structure.
    assert hash_of(build(selector=other_route)) == REFERENCE


def test_declaring_the_same_branch_paths_in_another_order_keeps_the_hash() -> None:
    swapped = build(
        paths=(
            path("standard", step("post", ship), step("track", notify)),
            path("express", step("courier", ship, compensate=refund)),
        )
    )
    assert hash_of(swapped) == REFERENCE


def _every_kind() -> Saga:
    saga = build().wait_for("approved").sub_saga("invoice", name="bill")
    saga.do_until(lambda ctx: True, step("poll", notify, compensate=void), name="polling")
    saga.do_while(lambda ctx: False, step("tick", notify))
    return saga.for_each(lambda ctx: [1], step("each", ship, compensate=refund))


def test_a_versions_stored_shape_hashes_to_it_and_names_each_node_as_an_operator_does() -> None:
    definition = _every_kind().seal()
    shape = shape_of(definition)
    assert hash_of_text(shape.text) == definition.hash, "the stored text is what is hashed"
    assert [name for name, _ in shape.nodes] == [node_name(n) for n in definition.nodes]
    assert read_shape(definition.name, definition.hash, shape.text) == shape
    labelled = Saga("order", version="7").step("reserve", reserve).seal()
    assert shape_of(labelled).label == "7"


def test_a_stored_shape_that_is_not_its_versions_is_refused() -> None:
    definition = build().seal()
    text = shape_of(definition).text
    with pytest.raises(SagaError, match="does not hash to that version"):
        read_shape(definition.name, definition.hash, text.replace("reserve", "reserva"))
    with pytest.raises(SagaError, match="does not hash to that version"):
        read_shape(definition.name, REFERENCE[:-1] + "0", text)


@pytest.mark.parametrize("change", list(STRUCTURAL_CHANGES), ids=list(STRUCTURAL_CHANGES))
def test_every_change_the_hash_sees_the_stored_shape_sees(change: str) -> None:
    """A process without a version judges its runs by the stored shape: two versions that
    hash apart must not look alike there."""
    changed, reference = shape_of(STRUCTURAL_CHANGES[change]().seal()), shape_of(build().seal())
    assert (changed.saga, changed.nodes) != (reference.saga, reference.nodes)
