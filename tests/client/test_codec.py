"""The payload codec: exact round-trip (values and types), refusals naming the path, size limit."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import OrderedDict, defaultdict, namedtuple
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from django.db import models
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.machine_zones import machine_zones
from weft_django.codec import MAX_DEPTH, CorruptPayloadError, decode, encode, encode_payload
from weft_django.exceptions import PayloadNotSerializableError, PayloadSizeExceededError, WeftError
from weft_django.validation import portable_zone

NEW_YORK = ZoneInfo("America/New_York")


def assert_identical(actual: Any, expected: Any) -> None:
    """Equal, and the same type all the way down (dict order, -0.0, Decimal exponent, utcoffset)."""
    assert type(actual) is type(expected), (actual, expected)
    assert actual == expected
    if isinstance(expected, float):
        assert math.copysign(1, actual) == math.copysign(1, expected)
    elif isinstance(expected, Decimal):
        assert actual.as_tuple() == expected.as_tuple()
    elif isinstance(expected, (datetime, time)):
        assert actual.replace(tzinfo=None) == expected.replace(tzinfo=None)
        assert actual.utcoffset() == expected.utcoffset()
        if isinstance(expected.tzinfo, ZoneInfo):
            assert actual.tzinfo is expected.tzinfo
    elif isinstance(expected, (list, tuple)):
        for got, want in zip(actual, expected, strict=True):
            assert_identical(got, want)
    elif isinstance(expected, dict):
        for (got_key, got), (want_key, want) in zip(actual.items(), expected.items(), strict=True):
            assert_identical(got_key, want_key)
            assert_identical(got, want)
    elif isinstance(expected, (set, frozenset)):
        by_value = {member: member for member in actual}
        for want in expected:
            assert_identical(by_value[want], want)


def round_trip(value: Any) -> Any:
    text = encode(value)
    assert isinstance(text, str)
    decoded = decode(text)
    assert_identical(decoded, value)
    assert encode(decoded) == text  # re-encoding the decoded value gives the same text
    return decoded


# --- property: every supported value round-trips exactly ------------------------------------------

fixed_offsets = st.builds(
    timezone,
    st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)),
)
# IANA zones only: a key whose zone the machine decides ("localtime", "posixrules", the "posix/" and
# "right/" copies, which st.timezones() draws) keeps only its offset (tested below).
iana_zones = st.timezone_keys(allow_prefix=False).filter(portable_zone).map(ZoneInfo)
zones = st.none() | st.just(UTC) | fixed_offsets | iana_zones
hashable_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.binary(max_size=20)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.decimals(allow_nan=False, allow_infinity=False, places=2)
    | st.uuids()
    | st.dates()
    | st.times(timezones=zones)
    | st.datetimes(timezones=zones)
    | st.timedeltas()
)
hashables = st.recursive(
    hashable_leaves,
    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.frozensets(inner, max_size=4),
    max_leaves=8,
)
values = st.recursive(
    hashable_leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_every_supported_value_round_trips_with_its_exact_type(value: Any) -> None:
    round_trip(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["$weft", "v", "a"]), values, max_size=3))
def test_user_dicts_with_the_tag_key_round_trip(value: dict[str, Any]) -> None:
    round_trip(value)
    round_trip([value, {"nested": value}])


# --- the format -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": [1.0, True, None, "é"]}, '{"b":1,"a":[1.0,true,null,"é"]}'),
        ((1, (2,)), '{"$weft":"tuple","v":[1,{"$weft":"tuple","v":[2]}]}'),
        ({"c", "a", "b"}, '{"$weft":"set","v":["a","b","c"]}'),
        (frozenset({2, 1}), '{"$weft":"frozenset","v":[1,2]}'),
        ({2: "x", None: "y"}, '{"$weft":"dict","v":[[2,"x"],[null,"y"]]}'),
        ({"$weft": "tuple", "v": [1]}, '{"$weft":"dict","v":[["$weft","tuple"],["v",[1]]]}'),
        (b"\x00\xff", '{"$weft":"bytes","v":"AP8="}'),
        (Decimal("1.10"), '{"$weft":"decimal","v":"1.10"}'),
        (UUID(int=1), '{"$weft":"uuid","v":"00000000-0000-0000-0000-000000000001"}'),
        (date(2024, 2, 29), '{"$weft":"date","v":"2024-02-29"}'),
        (time(1, 2, 3, 4), '{"$weft":"time","v":"01:02:03.000004"}'),
        (datetime(2024, 1, 1, tzinfo=UTC), '{"$weft":"datetime","v":"2024-01-01T00:00:00+00:00"}'),
        (
            datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=NEW_YORK),
            '{"$weft":"datetime","v":"2024-11-03T01:30:00-05:00[America/New_York]"}',
        ),
        (timedelta(days=-1, microseconds=5), '{"$weft":"timedelta","v":[-1,0,5]}'),
        ("a\x00b", '"a\\u0000b"'),
    ],
)
def test_format(value: Any, text: str) -> None:
    assert encode(value) == text
    assert_identical(decode(text), value)


def test_json_types_stay_distinct() -> None:
    decoded = round_trip([1, 1.0, True, False, 0, None, -0.0, 10**300, -(2**63), 1e300, 5e-324, ""])
    assert [type(item) for item in decoded[:4]] == [int, float, bool, bool]


def test_set_text_does_not_depend_on_iteration_order() -> None:
    members = [(1, "a"), "b", 2.5, frozenset({"z", "y"}), None, b"x"]
    assert encode(set(members)) == encode(set(reversed(members)))


def test_dict_order_is_kept_not_sorted() -> None:
    value = {"z": 1, "a": 2, 3: "m", "b": 4}
    assert list(round_trip(value)) == ["z", "a", 3, "b"]


def test_decimals_keep_their_exponent_and_sign() -> None:
    for text in ["1.10", "-0", "0E-7", "1E+2", "123456789012345678901234567890.000000001", "-0.00"]:
        round_trip(Decimal(text))


@pytest.mark.parametrize("fold", [0, 1])
def test_zoneinfo_datetimes_keep_zone_and_fold(fold: int) -> None:
    ambiguous = datetime(2024, 11, 3, 1, 30, fold=fold, tzinfo=NEW_YORK)
    decoded = round_trip(ambiguous)
    assert decoded.fold == fold and decoded.tzinfo is NEW_YORK
    assert decoded + timedelta(days=1) == ambiguous + timedelta(days=1)
    in_gap = datetime(2024, 3, 10, 2, 30, fold=fold, tzinfo=NEW_YORK)
    assert round_trip(in_gap).fold == fold


def test_a_zoneinfo_under_a_key_no_database_has_decodes_at_its_fixed_offset() -> None:
    """ZoneInfo.from_file(..., key=...) under an unknown key: encoded with its key, it could not be
    decoded ("one codec: payloads round-trip exactly"); it is normalised to its UTC offset instead."""
    with open("/usr/share/zoneinfo/Europe/Paris", "rb") as source:
        nowhere = ZoneInfo.from_file(source, key="Nowhere/Land")
    value = datetime(2024, 7, 1, 12, 0, tzinfo=nowhere)
    text = encode(value)
    assert "Nowhere" not in text
    decoded = decode(text)
    assert decoded == value and decoded.utcoffset() == timedelta(hours=2)
    assert decoded.tzinfo == timezone(timedelta(hours=2))


def test_a_zoneinfo_under_a_known_key_with_other_rules_keeps_its_instant() -> None:
    """ZoneInfo.from_file(..., key=...) under a key the database has, with another zone's rules: encoded
    with the key, it decoded under the database's rules for that key, moving the instant (here by 7
    hours, silently). It is normalised to its UTC offset, as one under an unknown key."""
    with open("/usr/share/zoneinfo/Europe/Paris", "rb") as source:
        paris_as_tokyo = ZoneInfo.from_file(source, key="Asia/Tokyo")
    value = datetime(2024, 7, 1, 12, 0, tzinfo=paris_as_tokyo)
    decoded = decode(encode(value))
    assert (decoded - value, decoded.utcoffset()) == (timedelta(0), timedelta(hours=2))
    assert round_trip(datetime(2024, 7, 1, 12, 0, tzinfo=ZoneInfo("Asia/Tokyo"))).tzinfo is ZoneInfo("Asia/Tokyo")


# Keys whose zone depends on the machine: "localtime" is its own zone (Debian links it to /etc/localtime),
# "posixrules" is chosen per installation, and the "posix/" and "right/" copies are missing from some
# (the tzdata package has neither). Each is a copy of Berlin's file on the machine that encodes.
MACHINE_KEYS = ["localtime", "posixrules", "posix/Europe/Berlin", "right/Europe/Berlin"]


@pytest.mark.parametrize("key", MACHINE_KEYS)
def test_a_datetime_in_a_zone_the_machine_decides_keeps_its_instant_on_another_machine(key, tmp_path) -> None:
    """Encoded with its key, a datetime in such a zone decoded on another machine under that machine's
    zone ("localtime" set to Tokyo there: the instant moved by 7 hours) or not at all (no posix/ or
    right/ files there: never readable again). It is normalised to its UTC offset, as a zone under an
    unknown key is."""
    with machine_zones(tmp_path / "here", dict.fromkeys(MACHINE_KEYS, "Europe/Berlin")):
        value = datetime(2024, 7, 1, 12, 0, tzinfo=ZoneInfo(key))
        text = encode(value)
    there = {"localtime": "Asia/Tokyo", "posixrules": "Asia/Tokyo", "Europe/Berlin": "Europe/Berlin"}
    with machine_zones(tmp_path / "there", there, only=True, forget=(key,)):
        decoded = decode(text)
    assert (decoded - value, decoded.utcoffset(), key in text) == (timedelta(0), timedelta(hours=2), False)


def test_a_stored_datetime_keyed_localtime_keeps_its_stored_offset(tmp_path) -> None:
    """Text written before the fix ("...[localtime]") decodes at the offset stored with it, the same on
    every machine, not at this machine's zone (which moved the instant when the machines differed)."""
    text = '{"$weft":"datetime","v":"2024-07-01T12:00:00+02:00[localtime]"}'
    with machine_zones(tmp_path, {"localtime": "Asia/Tokyo"}):
        decoded = decode(text)
    assert (decoded, decoded.utcoffset()) == (datetime(2024, 7, 1, 10, 0, tzinfo=UTC), timedelta(hours=2))


def test_times_keep_their_tzinfo() -> None:
    round_trip(time(23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-9, minutes=-30))))
    assert round_trip(time(5, tzinfo=ZoneInfo("Europe/Paris"))).tzinfo is ZoneInfo("Europe/Paris")
    for offset in [timedelta(seconds=1, microseconds=1), timedelta(microseconds=1), -timedelta(microseconds=999999)]:
        round_trip(time(5, tzinfo=timezone(offset)))
        round_trip(datetime(2024, 1, 1, 5, tzinfo=timezone(offset)))


def test_named_fixed_offset_is_normalised_to_its_offset() -> None:
    value = datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=1), "CET"))
    decoded = decode(encode(value))
    assert decoded == value and decoded.utcoffset() == timedelta(hours=1)


# --- subclasses -----------------------------------------------------------------------------------


class Colour(models.TextChoices):
    RED = "red", "Red"


class Size(models.IntegerChoices):
    LARGE = 3, "Large"


class Shade(enum.StrEnum):
    DARK = "dark"


class Level(enum.IntEnum):
    HIGH = 2


class Mode(str, enum.Enum):  # noqa: UP042 - str() of this member is "Mode.FAST", not its value
    FAST = "fast"


class Plain(enum.Enum):
    A = 1


class Moment(datetime):
    pass


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Colour.RED, "red"),
        (Size.LARGE, 3),
        (Level.HIGH, 2),
        (Shade.DARK, "dark"),
        (Mode.FAST, "fast"),
        (OrderedDict([("b", 1), ("a", 2)]), {"b": 1, "a": 2}),
        (defaultdict(list, {"a": [1]}), {"a": [1]}),
        (Point(1, 2), (1, 2)),
        ({Colour.RED: Level.HIGH}, {"red": 2}),
        (Moment(2024, 1, 1), datetime(2024, 1, 1)),
    ],
)
def test_subclasses_encode_as_their_base_type(value: Any, expected: Any) -> None:
    decoded = decode(encode(value))
    assert_identical(decoded, expected)
    assert decoded == value


# --- refusals name the path -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str


def refusal(value: Any, path: str = "args") -> PayloadNotSerializableError:
    with pytest.raises(PayloadNotSerializableError) as caught:
        encode(value, path=path)
    assert str(caught.value).startswith(caught.value.path + ": ")
    return caught.value


def test_unsupported_object_in_args_names_the_path_and_what_is_accepted() -> None:
    error = refusal([1, {"items": [0, 0, 0, Item("x")]}])
    assert error.path == "args[1]['items'][3]"
    assert "object of type Item is not serialisable" in str(error)
    assert "tuple, set, frozenset, bytes, Decimal, UUID, date, time, datetime, timedelta" in str(error)
    assert "convert it to a dict first" in str(error)


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        ({"a": [1.0, float("nan")]}, "args['a'][1]", "float nan"),
        ([float("inf")], "args[0]", "float inf"),
        ((float("-inf"),), "args[0]", "float -inf"),
        ({"total": Decimal("NaN")}, "args['total']", "not finite"),
        ({"total": Decimal("-Infinity")}, "args['total']", "not finite"),
        ({"total": Decimal("sNaN")}, "args['total']", "not finite"),
        ({"k": {"x": "ok\ud800"}}, "args['k']['x']", "lone surrogate"),
        ({"k": {"\udfff": 1}}, "args['k']<key '\\udfff'>", "lone surrogate"),
        ({"k": {(1, float("nan")): 1}}, "args['k']<key (1, nan)>[1]", "float nan"),
        ({"k": {Item("x"): 1}}, "args['k']<key Item(sku='x')>", "type Item"),
        ({"k": {7: {"x": object()}}}, "args['k'][7]['x']", "type object"),
        ({"tags": {1, float("inf")}}, "args['tags']<member inf>", "float inf"),
        ({"tags": frozenset({(1, float("nan"))})}, "args['tags']<member (1, nan)>[1]", "float nan"),
        ([bytearray(b"x")], "args[0]", "type bytearray"),
        ([Plain.A], "args[0]", "pass its .value"),
        ([1, [10**5000]], "args[1][0]", "digits"),
    ],
)
def test_refused_values_name_their_path(value: Any, path: str, words: str) -> None:
    error = refusal(value)
    assert error.path == path
    assert words in str(error)


class Opaque:
    pass


BAD_LEAVES = (Opaque(), float("nan"), float("-inf"), "x\ud800", Decimal("NaN"))


def with_one_bad_leaf(draw: Any, depth: int = 0) -> Any:
    shape = draw(st.sampled_from(["leaf"] if depth > 4 else ["leaf", "list", "tuple", "dict", "intdict"]))
    if shape == "leaf":
        return draw(st.sampled_from(BAD_LEAVES))
    good = st.integers() | st.text(max_size=3) | st.floats(allow_nan=False, allow_infinity=False)
    before = draw(st.lists(good, max_size=3))
    after = draw(st.lists(st.none() | st.booleans(), max_size=3))
    items = [*before, with_one_bad_leaf(draw, depth + 1), *after]
    if shape in ("list", "tuple"):
        return items if shape == "list" else tuple(items)
    keys = [f"k{index}" if shape == "dict" else index * 7 for index in range(len(items))]
    return dict(zip(keys, items, strict=True))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_refusal_path_is_an_expression_that_finds_the_bad_value(data: st.DataObject) -> None:
    value = with_one_bad_leaf(data.draw)
    error = refusal(value, path="args")
    found = eval(error.path, {"args": value})  # the path is a Python expression for lists and dicts
    assert any(found is bad for bad in BAD_LEAVES)


def test_top_level_refusal_uses_the_given_name() -> None:
    assert refusal(float("nan"), path="result").path == "result"
    assert refusal(object()).path == "args"
    with pytest.raises(PayloadNotSerializableError) as caught:
        encode({1j})
    assert caught.value.path.startswith("value<member")


def test_refusal_is_a_weft_error_and_does_not_mutate_the_input() -> None:
    value = {"a": (1, 2), "b": [float("nan")]}
    with pytest.raises(WeftError):
        encode(value)
    assert value["a"] == (1, 2) and type(value["a"]) is tuple


def test_cycles_are_refused_naming_where_they_close() -> None:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    error = refusal({"x": loop})
    assert error.path == "args['x'][1]['back']"
    assert "reference cycle" in str(error) and "args['x']" in str(error)
    selfish: dict[str, Any] = {}
    selfish["me"] = selfish
    assert refusal(selfish).path == "args['me']"
    ordered: OrderedDict[str, Any] = OrderedDict(a=1)
    ordered["me"] = [ordered]
    assert "reference cycle" in str(refusal(ordered))


def test_shared_references_are_not_cycles() -> None:
    shared = [1, 2]
    assert decode(encode([shared, shared, {"a": shared}])) == [[1, 2], [1, 2], {"a": [1, 2]}]


def nested(depth: int, make: Any = lambda inner: [inner]) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = make(value)
    return value


@pytest.mark.parametrize(
    "make",
    [
        lambda inner: [inner],
        lambda inner: (inner,),
        lambda inner: {"k": inner},
        lambda inner: {1: inner},
        lambda inner: frozenset({inner}),
    ],
)
def test_deep_nesting_is_refused_cleanly_never_a_recursion_error(make: Any) -> None:
    round_trip(nested(MAX_DEPTH, make))
    error = refusal(nested(MAX_DEPTH + 1, make))
    assert f"nested more than {MAX_DEPTH}" in str(error)
    refusal(nested(1000, make))
    refusal(nested(100_000, lambda inner: [inner]))


# --- size limit -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["abcdef", "é€𝄞x"])
def test_size_limit_counts_utf8_bytes_at_the_exact_boundary(text: str) -> None:
    value = {"s": text}
    size = len(encode(value).encode("utf-8"))
    assert size > len(encode(value)) or text.isascii()
    assert encode(value, max_bytes=size) == encode(value)
    assert encode(value, max_bytes=size + 1) == encode(value)
    with pytest.raises(PayloadSizeExceededError) as caught:
        encode(value, path="result", max_bytes=size - 1)
    message = str(caught.value)
    assert f"{size} bytes" in message and f"{size - 1} bytes" in message and "result" in message
    assert 'WEFT["PAYLOAD_MAX_BYTES"]' in message and "reference" in message


def test_encode_payload_reads_the_setting_at_call_time() -> None:
    value = ["x" * 20]
    size = len(encode(value))
    assert encode_payload(value) == encode(value)  # default 1 MiB
    with override_settings(WEFT={"PAYLOAD_MAX_BYTES": size}):
        assert encode_payload(value) == encode(value)
    with (
        override_settings(WEFT={"PAYLOAD_MAX_BYTES": size - 1}),
        pytest.raises(PayloadSizeExceededError) as caught,
    ):
        encode_payload(value, path="signal 'go'")
    assert "signal 'go'" in str(caught.value)


# --- decoding damaged rows ------------------------------------------------------------------------


def test_decode_none_is_none() -> None:
    assert decode(None) is None
    assert decode("null") is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ('{"a":1} x', "not valid JSON"),
        ("NaN", "NaN"),
        ("[1, -Infinity]", "-Infinity"),
        ('{"$weft":"complex","v":"1j"}', "malformed tagged value"),
        ('{"$weft":"tuple"}', "malformed tagged value"),
        ('{"$weft":"tuple","v":[1],"x":2}', "malformed tagged value"),
        ('{"$weft":["tuple"],"v":[1]}', "malformed tagged value"),
        ('{"$weft":"tuple","v":"ab"}', "expected a JSON list"),
        ('{"$weft":"set","v":[[1]]}', "'set'"),
        ('{"$weft":"dict","v":[["a"]]}', "not a [key, value] pair"),
        ('{"$weft":"dict","v":["ab"]}', "not a [key, value] pair"),
        ('{"$weft":"dict","v":[[[1],2]]}', "'dict'"),
        ('{"$weft":"bytes","v":"not base64!"}', "'bytes'"),
        ('{"$weft":"decimal","v":"one"}', "'decimal'"),
        ('{"$weft":"decimal","v":"NaN"}', "not finite"),
        ('{"$weft":"decimal","v":1.5}', "expected a JSON str"),
        ('{"$weft":"uuid","v":"xyz"}', "'uuid'"),
        ('{"$weft":"uuid","v":5}', "expected a JSON str"),
        ('{"$weft":"date","v":"2024-02-30"}', "'date'"),
        ('{"$weft":"time","v":"25:00"}', "'time'"),
        ('{"$weft":"datetime","v":"2024-01-01T00:00:00+00:00[Nowhere/Atlantis]"}', "'datetime'"),
        ('{"$weft":"datetime","v":"2024-01-01T00:00:00+00:00[UTC"}', "closing"),
        ('{"$weft":"timedelta","v":[1,2]}', "days, seconds, microseconds"),
        ('{"$weft":"timedelta","v":[1.5,0,0]}', "days, seconds, microseconds"),
        ('{"$weft":"timedelta","v":[1000000000,0,0]}', "'timedelta'"),
        ('[{"$weft":"tuple","v":[{"$weft":"bytes","v":7}]}]', "'bytes'"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_corrupt_text_raises_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(CorruptPayloadError) as caught:
        decode(text)
    assert words in str(caught.value)
    assert str(caught.value).startswith("Corrupt payload")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, WeftError)


def test_codec_text_is_plain_json() -> None:
    text = encode({"when": datetime(2024, 1, 1), "ids": (1, 2), "raw": b"\x01"})
    assert json.loads(text)["ids"] == {"$weft": "tuple", "v": [1, 2]}


@pytest.mark.parametrize(
    "value",
    [0, 1, -1, 7, 2**53 + 1, 2**63 - 1, -(2**63) + 1, 2**63, -(2**63), 10**30, True, False, None],
)
def test_scalars_written_without_the_walk_have_the_walks_text(value: Any) -> None:
    """encode() writes small ints, bools and None directly (the engine's commonest results); the text
    is json's, and decode() reads small ints and the constants directly too, to the same value."""
    text = encode(value)
    assert text == json.dumps(value)
    assert decode(text) == value and type(decode(text)) is type(value)
    assert decode(text) is value if value is None or isinstance(value, bool) else True


@pytest.mark.parametrize("text", ["007", "00", "01", "²", "١٢", "5.", "+5", "0x10", "NaN", "Infinity", "nul"])
def test_text_that_looks_like_a_small_int_but_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(CorruptPayloadError):
        decode(text)


def test_the_size_limit_applies_to_scalars_written_without_the_walk() -> None:
    assert encode(1234, max_bytes=4) == "1234"
    with pytest.raises(PayloadSizeExceededError, match="result is 5 bytes encoded, over the limit of 4"):
        encode(12345, path="result", max_bytes=4)
    with pytest.raises(PayloadSizeExceededError):
        encode(False, max_bytes=4)
    with override_settings(WEFT={"PAYLOAD_MAX_BYTES": 4}):
        with pytest.raises(PayloadSizeExceededError):
            encode_payload(10000)
        assert encode_payload(None) == "null" and encode_payload(9999) == "9999"
    assert encode_payload(10**18) == str(10**18)  # the limit read again once the override ended
