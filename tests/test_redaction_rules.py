"""What ``sensitive=`` marks, and how marked values are redacted from data and scrubbed
from free text: pure functions, checked over many inputs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_saga import Saga, step
from celery_saga.definition.run_markings import run_markings
from celery_saga.definition.sensitivity import DataPath, Sensitivity
from celery_saga.errors import DefinitionError
from celery_saga.redaction import NOT_REGISTERED, REDACTED, redact, run_secrets, scrub, secrets_in

CARD = Sensitivity(keys=frozenset({"card"}))


def _noop() -> None:
    return None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"card": "4111-1111", "order": 7}, {"card": REDACTED, "order": 7}),
        ({"payer": {"card": {"pan": "4111"}}}, {"payer": {"card": REDACTED}}),
        ([{"card": 1}, {"other": 2}], [{"card": REDACTED}, {"other": 2}]),
        (({"card": "x"},), ({"card": REDACTED},)),
        ("card", "card"),
        ({"cards": "x", "Card": "y"}, {"cards": "x", "Card": "y"}),  # exact key names only
        (None, None),
    ],
)
def test_marked_keys_are_redacted_at_any_depth_of_the_input(value: Any, expected: Any) -> None:
    assert redact(value, ("input",), CARD) == expected


def test_a_step_or_event_named_like_a_marked_key_is_not_marked_by_it() -> None:
    assert redact({"x": 1}, ("results", "card"), CARD) == {"x": 1}
    assert redact({"x": 1}, ("signals", "card"), CARD) == {"x": 1}
    assert redact({"card": 1}, ("results", "charge"), CARD) == {"card": REDACTED}


def test_a_marked_step_hides_its_whole_result_and_every_iteration() -> None:
    marks = Sensitivity(steps=frozenset({"charge"}))
    assert redact({"token": "t"}, ("results", "charge"), marks) == REDACTED
    assert redact([1, 2], ("results", "charge:3"), marks) == REDACTED
    assert redact({"token": "t"}, ("results", "charge:extra"), marks) == {"token": "t"}
    assert redact({"token": "t"}, ("results", "reserve"), marks) == {"token": "t"}


def test_a_callable_sees_every_path_and_value_and_a_raising_one_marks() -> None:
    seen: list[DataPath] = []

    def rule(path: DataPath, value: Any) -> bool:
        seen.append(path)
        return path[-1] == 1

    marks = Sensitivity(predicate=rule)
    assert redact({"a": [5, 6]}, ("signals", "paid"), marks) == {"a": [5, REDACTED]}
    paid: DataPath = ("signals", "paid")
    assert seen == [paid, (*paid, "a"), (*paid, "a", 0), (*paid, "a", 1)]

    def broken(path: DataPath, value: Any) -> bool:
        raise RuntimeError("bug")

    assert redact({"a": 1}, ("input",), Sensitivity(predicate=broken)) == REDACTED


def test_secrets_are_the_text_of_marked_leaves_long_enough_to_matter() -> None:
    value = {"card": {"pan": "4111-1111", "cvc": 123, "ok": True, "amount": 12.5}, "order": 9999}
    assert secrets_in(value, ("input",), CARD) == {"4111-1111", "12.5"}
    quoted = secrets_in({"card": "O'Neil\n"}, ("input",), CARD)
    assert quoted == {"O'Neil\n", "O'Neil\\n"}  # as str() and as repr() inside a dict show it


def test_run_secrets_cover_input_results_and_payloads() -> None:
    marks = Sensitivity(keys=frozenset({"card"}), steps=frozenset({"tokenize"}))
    found = run_secrets(
        marks,
        {"card": "4111-1111"},
        {"tokenize": {"token": "tok_abcdef"}, "reserve": {"hold": "hold-1"}},
        {"paid": {"card": "5500-0000"}},
    )
    assert found == {"4111-1111", "tok_abcdef", "5500-0000"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("card 4111-1111 declined", f"card {REDACTED} declined"),
        ("4111-1111-2222 and 4111-1111", f"{REDACTED} and {REDACTED}"),  # the longest first
        ("nothing here", "nothing here"),
        ("", ""),
        ("a.b*c (4111-1111)", f"{REDACTED}c ({REDACTED})"),  # no regex meaning
    ],
)
def test_scrub_replaces_every_occurrence(text: str, expected: str) -> None:
    assert scrub(text, {"4111-1111", "4111-1111-2222", "a.b*"}) == expected


#: Leaf text that cannot spell part of ``[redacted]`` once a neighbour is replaced.
_LEAF_TEXT = st.text(alphabet="0123456789WXYZ -'\"\\\n", max_size=12)
_KEYS = st.sampled_from(["card", "pan", "name", "order"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _LEAF_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS | st.text(max_size=3), inner),
    max_leaves=20,
)


@given(_json, st.sets(_KEYS, max_size=3))
def test_redacted_data_holds_no_marked_value_and_keeps_the_rest(value: Any, keys: set[str]) -> None:
    marks = Sensitivity(keys=frozenset(keys))

    def same_but_marked(original: Any, shown: Any) -> None:
        if isinstance(original, dict):
            assert list(shown) == list(original)
            for key, inner in original.items():
                if key in keys:
                    assert shown[key] == REDACTED
                else:
                    same_but_marked(inner, shown[key])
        elif isinstance(original, list):
            assert len(shown) == len(original)
            for inner, shown_inner in zip(original, shown, strict=True):
                same_but_marked(inner, shown_inner)
        else:
            assert shown == original

    same_but_marked(value, redact(value, ("input",), marks))
    assert redact(value, ("input",), Sensitivity()) is value
    for secret in secrets_in(value, ("input",), marks):
        assert secret not in scrub(repr(value), secrets_in(value, ("input",), marks))


def test_markings_are_checked_when_the_saga_is_built() -> None:
    with pytest.raises(DefinitionError, match="tuple or list"):
        Saga("o", sensitive="card")
    with pytest.raises(DefinitionError, match="non-empty strings"):
        Saga("o", sensitive=("card", 3))
    with pytest.raises(DefinitionError, match="sensitive=True or False"):
        Saga("o").step("charge", _noop, sensitive="yes")
    with pytest.raises(DefinitionError, match="sensitive=True or False"):
        Saga("o").parallel("g", step("charge", _noop, sensitive=1))


def test_markings_do_not_change_the_version() -> None:
    plain = Saga("o").step("charge", _noop).seal()
    marked = Saga("o", sensitive=("card",)).step("charge", _noop, sensitive=True).seal()
    assert marked.hash == plain.hash
    assert marked.sensitive == Sensitivity(keys=frozenset({"card"}), steps=frozenset({"charge"}))
    assert plain.sensitive.empty


def _family() -> dict[str, Any]:
    child = (
        Saga("vault", sensitive=("pin",)).step("open", _noop).step("seal", _noop, sensitive=True)
    )
    parent = Saga("order", sensitive=("card",)).step("charge", _noop).sub_saga("vault", name="v")
    return {d.name: d for d in (child.seal(), parent.seal())}


def test_a_sub_sagas_record_is_marked_by_the_childs_markings_and_the_parents() -> None:
    sagas = _family()
    marks = run_markings(lambda name, _hash: sagas.get(name), "order", None)
    record = {"open": {"pin": "7351", "note": "ok", "card": "4111"}, "seal": {"token": "t"}}
    assert redact(record, ("results", "v"), marks) == {
        "open": {"pin": REDACTED, "note": "ok", "card": REDACTED},
        "seal": REDACTED,
    }
    assert redact({"pin": "7351"}, ("input",), marks) == {"pin": "7351"}  # the child's only
    assert secrets_in(record, ("results", "v"), marks) == {"7351", "4111"}


def test_a_saga_not_registered_marks_everything_as_such() -> None:
    sagas = _family()
    unknown = run_markings(lambda name, _hash: None, "order", "abc")
    assert redact({"order": 1}, ("input",), unknown) == NOT_REGISTERED
    assert secrets_in({"order": "A-1001"}, ("input",), unknown) == {"A-1001"}
    without_child = run_markings(
        lambda name, _hash: sagas.get(name, None) if name == "order" else None, "order", None
    )
    assert redact({"open": {}}, ("results", "v"), without_child) == NOT_REGISTERED
    assert redact({"card": "4111"}, ("results", "charge"), without_child) == {"card": REDACTED}
    assert run_markings(lambda name, _hash: Saga(name).step("s", _noop).seal(), "x", None).empty
