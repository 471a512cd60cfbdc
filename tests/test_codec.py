"""The msgpack payload codec: exact round-trips of the supported types, and a clear
``PayloadError`` naming the type for everything else, before anything is written
(guarantee 24: non-serialisable input or results, oversize payloads)."""

from __future__ import annotations

import datetime as dt
import enum
import math
import time
import uuid
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_saga import PayloadError
from celery_saga.store.codec import DEFAULT_MAX_PAYLOAD_BYTES, MAX_NESTING, pack, unpack

UTC_PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))
UTC_MINUS_0945 = dt.timezone(dt.timedelta(hours=-9, minutes=-45))


def same(left: Any, right: Any) -> bool:
    """Equal AND of the same type all the way down, with the details ``==`` ignores."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(
            same(left[k], right[k]) and type(k) is type(next(r for r in right if r == k))
            for k in left
        )
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, float):
        return math.copysign(1, left) == math.copysign(1, right) and (
            left == right or (math.isnan(left) and math.isnan(right))
        )
    if isinstance(left, Decimal):
        return left.as_tuple() == right.as_tuple()
    if isinstance(left, (dt.datetime, dt.time)):
        return (
            left == right
            and left.utcoffset() == right.utcoffset()
            and ((left.tzinfo is None) == (right.tzinfo is None))
        )
    return bool(left == right)


def round_trip(value: Any) -> Any:
    return unpack(pack(value))


# -- exact round-trips -----------------------------------------------------------------

EXAMPLES = {
    "naive datetime": dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
    "utc datetime": dt.datetime(2024, 1, 1, 0, 0, tzinfo=dt.timezone.utc),
    "+05:30 datetime": dt.datetime(2024, 6, 1, 12, 30, 15, 7, tzinfo=UTC_PLUS_0530),
    "-09:45 datetime": dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC_MINUS_0945),
    "datetime.min": dt.datetime.min,
    "date": dt.date(2024, 2, 29),
    "date of year 1": dt.date(1, 1, 1),
    "naive time": dt.time(7, 8, 9, 10),
    "midnight": dt.time(0, 0),
    "tz-aware time": dt.time(7, 8, 9, tzinfo=UTC_PLUS_0530),
    "timedelta": dt.timedelta(days=3, seconds=4, microseconds=5),
    "negative timedelta": dt.timedelta(microseconds=-1),
    "timedelta.max": dt.timedelta.max,
    "timedelta.min": dt.timedelta.min,
    "Decimal 1.10": Decimal("1.10"),
    "Decimal -0.000": Decimal("-0.000"),
    "Decimal 1E+3": Decimal("1E+3"),
    "Decimal with 40 digits": Decimal("1234567890.123456789012345678901234567890"),
    "Decimal Infinity": Decimal("-Infinity"),
    "UUID": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "nil UUID": uuid.UUID(int=0),
    "bytes": b"\x00\xff binary",
    "empty bytes": b"",
    "str": "grüße \u2603 \x00",
    "uint64 max": 2**64 - 1,
    "int64 min": -(2**63),
    "negative zero float": -0.0,
    "bool": True,
    "None": None,
    "int keys": {1: "one", -2: "minus two", 2**40: "big"},
    "nested": {
        "order": {
            "id": uuid.UUID(int=7),
            "lines": [
                {"sku": "A", "price": Decimal("9.90"), "at": dt.datetime(2024, 1, 1, 9)},
                {"sku": "B", "price": Decimal("0.10"), "raw": b"\x01", "tags": []},
            ],
            "due": dt.date(2024, 1, 31),
            "window": [dt.time(8), dt.time(17, 30)],
            "ttl": dt.timedelta(hours=2),
        },
        "empty": {},
    },
}


@pytest.mark.parametrize("value", list(EXAMPLES.values()), ids=list(EXAMPLES))
def test_supported_value_round_trips_exactly(value: Any) -> None:
    assert same(round_trip(value), value)


def test_decimal_keeps_its_exponent() -> None:
    result = round_trip(Decimal("1.10"))
    assert isinstance(result, Decimal)
    assert str(result) == "1.10"
    assert result.as_tuple().exponent == -2


def test_aware_datetime_keeps_its_offset_and_naive_stays_naive() -> None:
    aware = round_trip(dt.datetime(2024, 6, 1, 12, tzinfo=UTC_PLUS_0530))
    naive = round_trip(dt.datetime(2024, 6, 1, 12))
    assert aware.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert naive.tzinfo is None


def test_datetime_is_not_decoded_as_a_date() -> None:
    assert type(round_trip(dt.datetime(2024, 1, 1))) is dt.datetime
    assert type(round_trip(dt.date(2024, 1, 1))) is dt.date


def test_tuples_are_stored_as_lists() -> None:
    assert round_trip((1, (2, "x"))) == [1, [2, "x"]]


# -- refused values --------------------------------------------------------------------


class Money:
    def __init__(self, cents: int) -> None:
        self.cents = cents


class Colour(enum.Enum):
    RED = 1


REFUSED = {
    "set": ({1, 2}, "set"),
    "frozenset": (frozenset({"a"}), "frozenset"),
    "object": (object(), "object"),
    "custom class": (Money(5), "Money"),
    "plain Enum": (Colour.RED, "Colour"),
    "Fraction": (Fraction(1, 3), "Fraction"),
    "complex": (1j, "complex"),
    "int above uint64": (2**64, "int"),
    "int below int64": (-(2**63) - 1, "int"),
    "huge int": (10**30, "int"),
    "set nested in a dict": ({"lines": [{"tags": {"x"}}]}, "set"),
    "object as a dict value": ({"a": object()}, "object"),
    "function": (len, "builtin_function_or_method"),
}


@pytest.mark.parametrize(("value", "type_name"), list(REFUSED.values()), ids=list(REFUSED))
def test_unsupported_value_is_refused_with_payload_error_naming_the_type(
    value: Any, type_name: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        pack(value)
    message = str(caught.value)
    named = [repr(type_name), "integer"] if type_name == "int" else [repr(type_name)]
    assert any(name in message for name in named), message


def test_refusal_names_what_was_being_stored() -> None:
    with pytest.raises(PayloadError) as caught:
        pack({"tags": {"a"}}, what="input of saga 'order'")
    message = str(caught.value)
    assert message.startswith("input of saga 'order'")
    assert "'set'" in message


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"card": {"numbers": [{"S3CR3T-4111"}]}}, "type 'set' at card.numbers[0];"),
        ({"card": [1, 2**70 + 41]}, "the integer at card[1] is outside the 64-bit range"),
        (2**70 + 41, "the integer at the top level is outside"),
        ({"grid": {("S3CR3T", 2): "cell"}}, "a dictionary key of type 'tuple' in grid cannot"),
        ({"k" * 50: {3: Fraction(41, 3)}}, f"type 'Fraction' at {'k' * 40}...[3];"),
    ],
)
def test_a_refusal_names_the_type_and_the_path_never_the_value(value: Any, named: str) -> None:
    with pytest.raises(PayloadError) as caught:
        pack(value, what="result")
    message = str(caught.value)
    assert message.startswith("result: ") and named in message, message
    assert "S3CR3T" not in message and str(2**70 + 41) not in message and "41/3" not in message
    assert caught.value.__suppress_context__  # no chained error shows the value either


def test_payload_error_is_a_saga_error() -> None:
    from celery_saga import SagaError

    with pytest.raises(SagaError):
        pack({1, 2})


def test_dict_with_tuple_keys_is_refused_before_anything_is_written() -> None:
    with pytest.raises(PayloadError, match="tuple"):
        pack({"grid": {(1, 2): "cell"}})


# -- nesting, cycles and shared containers -------------------------------------------------


def nested(depth: int) -> Any:
    """``depth`` lists, each the only member of the one around it."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_up_to_the_limit_round_trips_and_one_level_more_is_refused() -> None:
    assert same(round_trip(nested(MAX_NESTING)), nested(MAX_NESTING))
    with pytest.raises(PayloadError, match=f"input of saga 'x'.*more than {MAX_NESTING} levels"):
        pack(nested(MAX_NESTING + 1), what="input of saga 'x'")


def test_nesting_far_past_the_recursion_limit_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="levels deep"):
        pack({"deep": nested(50_000)})


@pytest.mark.parametrize("shape", ["list", "dict", "through a tuple", "deep inside"])
def test_a_value_that_contains_itself_is_refused(shape: str) -> None:
    looped: Any
    if shape == "list":
        looped = [1]
        looped.append(looped)
    elif shape == "dict":
        looped = {"a": 1}
        looped["self"] = looped
    elif shape == "through a tuple":
        inner: list[Any] = []
        looped = {"t": (1, inner)}
        inner.append(looped)
    else:
        holder: dict[str, Any] = {}
        looped = {"x": [[{"y": holder}]]}
        holder["back"] = looped["x"]
    with pytest.raises(PayloadError, match=r"payload of signal 'go'.*contains itself"):
        pack(looped, what="payload of signal 'go'")


def test_a_container_shared_without_a_cycle_is_stored_once_per_use() -> None:
    shared = {"sku": "A1"}
    assert round_trip({"first": shared, "second": [shared, shared]}) == {
        "first": {"sku": "A1"},
        "second": [{"sku": "A1"}, {"sku": "A1"}],
    }


def test_sharing_that_multiplies_past_the_limit_is_refused_without_packing_it() -> None:
    doubled: Any = []
    for _ in range(64):  # 2**64 elements once packed: packing would never end
        doubled = [doubled, doubled]
    started = time.monotonic()
    with pytest.raises(PayloadError, match="more than 1000 values; the limit is 1000"):
        pack(doubled, limit=1000)
    assert time.monotonic() - started < 5


# -- size limit ------------------------------------------------------------------------


def test_payload_over_the_limit_is_refused_naming_size_and_limit() -> None:
    with pytest.raises(PayloadError) as caught:
        pack(b"x" * 100, what="result of step 'charge'", limit=64)
    message = str(caught.value)
    assert "result of step 'charge'" in message
    assert "64" in message
    assert "102" in message  # 100 bytes plus the two-byte bin8 header


def test_payload_exactly_at_the_limit_is_accepted() -> None:
    size = len(pack(b"x" * 100))
    assert unpack(pack(b"x" * 100, limit=size)) == b"x" * 100
    with pytest.raises(PayloadError):
        pack(b"x" * 100, limit=size - 1)


def test_default_limit_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    fits = b"x" * (DEFAULT_MAX_PAYLOAD_BYTES - 5)  # bin32 header is five bytes
    assert len(pack(fits)) == DEFAULT_MAX_PAYLOAD_BYTES
    with pytest.raises(PayloadError):
        pack(fits + b"x")


def test_unpack_of_none_is_none() -> None:
    assert unpack(None) is None


# -- property: recursive JSON-like data with the extension scalars ---------------------

offsets = st.timedeltas(
    min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59)
).map(lambda delta: dt.timezone(dt.timedelta(minutes=delta // dt.timedelta(minutes=1))))
timezones = st.none() | st.just(dt.timezone.utc) | offsets

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(timezones=timezones),
    st.dates(),
    st.times(timezones=timezones),
    st.timedeltas(),
    st.decimals(allow_nan=False),
    st.uuids(),
)
keys = st.text() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
payloads = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(payloads)
def test_any_supported_payload_round_trips_exactly(value: Any) -> None:
    assert same(round_trip(value), value)


@settings(max_examples=100, deadline=None)
@given(payloads, st.sampled_from([{1}, object(), Money(1), 2**64, frozenset()]))
def test_one_unsupported_leaf_anywhere_refuses_the_whole_payload(value: Any, bad: Any) -> None:
    with pytest.raises(PayloadError):
        pack({"payload": value, "deep": [[{"bad": bad}]]})
