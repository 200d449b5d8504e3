"""Payload encoding: exact round-trip or a clear refusal, and the size limit.

Payload columns hold this module's text, and workflow code always sees ``decode(encode(value))``, so
the live run and a replay see the same value. The text is compact JSON (dict order kept, never
sorted). Values JSON cannot hold exactly become tagged objects ``{"$weft": <tag>, "v": <payload>}``:

    tuple, set, frozenset  "v" is the list of members (sets sorted by their encoded text, so the
                           text does not depend on hash seeds)
    dict                   "v" is ``[[key, value], ...]`` in order; used when a key is not a plain
                           str, or when a plain dict has a "$weft" key (escaping it)
    bytes                  standard base64
    decimal                ``str(d)``: exponent kept, so Decimal("1.10") stays "1.10"
    uuid                   ``str(u)``
    date, time, datetime   ``isoformat()``: microseconds and UTC offset kept; a ZoneInfo zone is
                           kept as an RFC 9557 suffix, "2024-11-03T01:30:00-05:00[America/New_York]"
    timedelta              ``[days, seconds, microseconds]``

Choices, documented because they lose something:
- Subclasses of str/int/float/dict/list/tuple/set/frozenset and of the tagged types encode as the
  base type: TextChoices, StrEnum and IntEnum members decode as plain str/int, OrderedDict and
  defaultdict as dict, a namedtuple as tuple, freezegun's FakeDatetime as datetime. Values compare
  equal. Other Enum members are refused (pass ``.value``).
- A tzinfo other than a ZoneInfo whose key is an IANA name that loads here with the same offset
  (``datetime.timezone``, pytz, dateutil, a ``ZoneInfo.from_file`` under an unknown key or under a
  known key with other rules, a ZoneInfo whose zone the machine decides: "localtime", "posixrules",
  the "posix/" and "right/" copies; ``validation.portable_zone``) is normalised to its fixed UTC
  offset; the instant is kept, the zone name and DST rules are not. ``fold`` is kept only as far as
  the offset implies it. Text keyed with such a zone that loads here ("[localtime]", written before
  this rule) decodes at its stored offset.
- Shared references decode as separate copies; cycles are refused.
- Refused: NaN and infinities (float and Decimal), str with lone surrogates (not valid UTF-8),
  ints beyond ``sys.get_int_max_str_digits()``, nesting deeper than MAX_DEPTH containers, and
  every other type. The error names the path, e.g. ``args[1]['items'][3]``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from django.conf import settings

from weft_django.exceptions import PayloadNotSerializableError, PayloadSizeExceededError
from weft_django.validation import is_storable, portable_zone

TAG = "$weft"
MAX_DEPTH = 100  # containers; keeps the walk and the C json recursion far from the interpreter's limit
_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})  # checked lazily (see encode)
_ACCEPTED = (
    "Pass JSON-compatible data (str, int, float, bool, None, list, dict) or one of: tuple, set, "
    "frozenset, bytes, Decimal, UUID, date, time, datetime, timedelta"
)


def _json_encoder() -> Callable[[Any], str]:
    """json text of an already walked value: compact, non-ASCII kept, NaN and infinities refused
    (ValueError). ``JSONEncoder.encode`` builds its C encoder again on every call, about half the cost
    of encoding a small payload (an activity's arguments); the C encoder is built here once."""
    options = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return options.encode
    chunks = make(None, options.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    return lambda value: "".join(chunks(value, 0))


_encode_json = _json_encoder()


from .exceptions import CorruptPayloadError  # noqa: E402 - re-exported: it used to live here


class _Refused(Exception):
    """Raised inside the walk; each container frame adds its segment on the way out."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.trail: list[tuple[str, object]] = []  # (segment, container), innermost first


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _clock_text(value: datetime | time) -> str:
    """isoformat(), with the zone's key when decoding re-creates the same zone from it on any machine:
    a key no database has was refused when decoded (never readable again), and "localtime" decoded
    under the decoding machine's own zone (the instant moved); both keep their UTC offset only."""
    text = value.isoformat()
    zone = value.tzinfo
    if type(zone) is ZoneInfo and zone.key and portable_zone(zone.key) and _keyed_offset(value, zone.key):
        return f"{text}[{zone.key}]"
    if zone is not None and value.utcoffset() is None:
        raise _Refused(f"{type(value).__name__} has a tzinfo ({zone!r}) without a UTC offset")
    return text


def _keyed_offset(value: datetime | time, key: str) -> bool:
    """Whether the zone the database has under ``key`` gives ``value`` its UTC offset. A
    ``ZoneInfo.from_file`` under a known key with other rules (another zone's file) decoded under the
    database's rules, which moved the instant; it is normalised to its fixed UTC offset instead."""
    known = ZoneInfo(key)
    return value.tzinfo is known or value.replace(tzinfo=known).utcoffset() == value.utcoffset()


def _decimal_text(value: Decimal) -> str:
    if not value.is_finite():
        raise _Refused(f"Decimal {value} is not finite; NaN and infinities are refused")
    return str(value)


_LEAVES: dict[type, tuple[str, Callable[[Any], object]]] = {
    bytes: ("bytes", lambda value: base64.b64encode(value).decode("ascii")),
    Decimal: ("decimal", _decimal_text),
    UUID: ("uuid", str),
    datetime: ("datetime", _clock_text),
    date: ("date", date.isoformat),
    time: ("time", _clock_text),
    timedelta: ("timedelta", lambda value: [value.days, value.seconds, value.microseconds]),
}
_CONTAINERS = (dict, list, tuple, set, frozenset)
# The base type's own slot, not the subclass's: str() of a (str, Enum) member is "E.A", not its value.
_SCALAR_BASES: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
)


def _walk(value: Any, depth: int, skip: frozenset[type]) -> Any:
    """Return ``value`` ready for json, sharing every part that needs no change."""
    kind = type(value)
    if kind is str:
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                raise _Refused(f"str has a lone surrogate {value[exc.start]!r} at {exc.start}") from None
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _Refused(f"float {value} is refused; NaN and infinities have no exact JSON form")
        return value
    if kind is int:
        if value.bit_length() > 10_000:
            try:
                str(value)
            except ValueError:
                raise _Refused("int has more digits than sys.get_int_max_str_digits() allows") from None
        return value
    if kind is bool or value is None:
        return value
    if kind in _CONTAINERS:
        return _walk_container(value, kind, depth, skip)
    leaf = _LEAVES.get(kind)
    if leaf is None:
        return _walk_subclass(value, depth, skip)
    return {TAG: leaf[0], "v": leaf[1](value)}


def _walk_container(value: Any, kind: type, depth: int, skip: frozenset[type]) -> Any:
    if depth >= MAX_DEPTH:
        raise _Refused(f"nested more than {MAX_DEPTH} containers deep")
    if kind is dict:
        return _walk_dict(value, depth + 1, skip)
    if kind is list:
        return _walk_list(value, depth + 1, skip)
    if kind is tuple:
        return {TAG: "tuple", "v": _walk_list(value, depth + 1, skip)}
    return {TAG: kind.__name__, "v": _walk_members(value, depth + 1, skip)}


def _walk_subclass(value: Any, depth: int, skip: frozenset[type]) -> Any:
    """Encode a subclass instance of a supported type as that type (see the module docstring)."""
    if isinstance(value, Enum) and not isinstance(value, (str, int, float)):
        raise _Refused(f"Enum member {value!r} is not serialisable; pass its .value")
    for base, as_base in _SCALAR_BASES:
        if isinstance(value, base):
            return _walk(as_base(value), depth, skip)
    for container in _CONTAINERS:  # walked as they are: json writes subclasses as their base type
        if isinstance(value, container):
            return _walk_container(value, container, depth, skip)
    for base, (tag, to_text) in _LEAVES.items():  # datetime comes before date
        if isinstance(value, base):
            return {TAG: tag, "v": to_text(value)}
    raise _Refused(
        f"object of type {type(value).__qualname__} is not serialisable. {_ACCEPTED}; convert it to a "
        "dict first (dataclasses.asdict(), model_to_dict()) or pass a primary key"
    )


def _walk_list(items: list[Any] | tuple[Any, ...], depth: int, skip: frozenset[type]) -> Any:
    out = None
    for index, item in enumerate(items):
        if type(item) in skip:
            continue
        try:
            new = _walk(item, depth, skip)
        except _Refused as refusal:
            refusal.trail.append((f"[{index}]", items))
            raise
        if new is not item:
            if out is None:
                out = list(items)
            out[index] = new
    return items if out is None else out


def _walk_dict(mapping: dict[Any, Any], depth: int, skip: frozenset[type]) -> Any:
    if TAG in mapping or not skip:  # the strict pass inspects keys too, as pairs do
        return _walk_pairs(mapping, depth, skip)
    out = None
    for key, item in mapping.items():
        if type(key) is not str:
            return _walk_pairs(mapping, depth, skip)
        if type(item) in skip:
            continue
        try:
            new = _walk(item, depth, skip)
        except _Refused as refusal:
            refusal.trail.append((f"[{key!r}]", mapping))
            raise
        if new is not item:
            if out is None:
                out = dict(mapping)  # same keys, same order; only values are replaced
            out[key] = new
    return mapping if out is None else out


def _walk_pairs(mapping: dict[Any, Any], depth: int, skip: frozenset[type]) -> Any:
    pairs = []
    for key, item in mapping.items():
        segment = f"<key {_short(key)}>"
        try:
            new_key = _walk(key, depth, skip)
            segment = f"[{key!r}]"
            pairs.append([new_key, _walk(item, depth, skip)])
        except _Refused as refusal:
            refusal.trail.append((segment, mapping))
            raise
    return {TAG: "dict", "v": pairs}


def _walk_members(members: set[Any] | frozenset[Any], depth: int, skip: frozenset[type]) -> Any:
    encoded = []
    for member in members:
        try:
            new = _walk(member, depth, skip)
            encoded.append((_encode_json(new), new))
        except _Refused as refusal:
            refusal.trail.append((f"<member {_short(member)}>", members))
            raise
    encoded.sort(key=lambda pair: pair[0])
    return [new for _, new in encoded]


def _refusal_error(refusal: _Refused, path: str) -> PayloadNotSerializableError:
    steps = refusal.trail[::-1]  # outermost first
    seen: dict[int, int] = {}
    for position, (_, container) in enumerate(steps):
        if id(container) in seen:
            here = path + "".join(segment for segment, _ in steps[:position])
            first = path + "".join(segment for segment, _ in steps[: seen[id(container)]])
            message = (
                f"{here}: reference cycle: this {type(container).__name__} is the same object as {first}. "
                "Payloads must be trees; pass ids instead of back-references"
            )
            return PayloadNotSerializableError(message, path=here)
        seen[id(container)] = position
    where = path + "".join(segment for segment, _ in steps)
    return PayloadNotSerializableError(f"{where}: {refusal.reason}", path=where)


_SMALL_INT = 1 << 63  # an int inside this range is written as its repr, without the walk (same text)


def encode(value: Any, *, path: str = "value", max_bytes: int | None = None) -> str:
    """Encode ``value`` as codec text, or raise PayloadNotSerializableError naming the bad part.

    With ``max_bytes``, text longer than that many UTF-8 bytes raises PayloadSizeExceededError.
    """
    kind = type(value)
    if kind is int and -_SMALL_INT < value < _SMALL_INT:
        text = int.__repr__(value)  # ASCII: its length is its size in bytes
        return _within(text, len(text), path, max_bytes)
    if kind is bool or value is None:
        text = "null" if value is None else "true" if value else "false"
        return _within(text, len(text), path, max_bytes)
    try:
        try:
            # Fast pass: str/int/float inside containers are not inspected here; json refuses NaN,
            # infinities and huge ints (ValueError), and UTF-8 refuses surrogates. Then a strict
            # pass inspects everything to name the path.
            text = _encode_json(_walk(value, 0, _PLAIN))
            size = len(text) if text.isascii() else len(text.encode())
        except ValueError as exc:
            _walk(value, 0, frozenset())
            raise PayloadNotSerializableError(f"{path}: {exc}", path=path) from exc
    except _Refused as refusal:
        raise _refusal_error(refusal, path) from None
    except RecursionError:
        raise PayloadNotSerializableError(f"{path}: nested too deeply to encode", path=path) from None
    return _within(text, size, path, max_bytes)


def _within(text: str, size: int, path: str, max_bytes: int | None) -> str:
    """``text`` (``size`` UTF-8 bytes), or PayloadSizeExceededError when that is over ``max_bytes``."""
    if max_bytes is not None and size > max_bytes:
        raise PayloadSizeExceededError(
            f"{path} is {size} bytes encoded, over the limit of {max_bytes} bytes. Raise "
            'WEFT["PAYLOAD_MAX_BYTES"], or store large data elsewhere (a model, object storage) and '
            "pass a reference to it"
        )
    return text


def storable_text(text: str) -> str:
    """``text`` as a database text or jsonb value can hold it, for the messages weft records (an
    exception's message and traceback, a validator's issue), not payloads (codec text, where JSON
    escapes both): a NUL, which PostgreSQL refuses in text and in jsonb, is written as the four
    characters ``\\x00``, and an unpaired surrogate, which UTF-8 cannot encode, as its ``\\udxxx`` escape."""
    if is_storable(text):
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def encode_payload(value: Any, *, path: str = "value") -> str:
    """``encode`` with the WEFT["PAYLOAD_MAX_BYTES"] limit."""
    return encode(value, path=path, max_bytes=_payload_limit())


# (settings.WEFT, its PAYLOAD_MAX_BYTES, the validated limit): validating the setting on every encode
# cost about as much as encoding a small payload. override_settings swaps the WEFT dict, and a changed
# value is seen too, so the cache is re-validated whenever either differs.
_limit: tuple[object, object, int] | None = None


# django.conf.settings (a LazySettings) keeps each setting read in its own __dict__, emptied whenever
# its wrapped settings are replaced (override_settings): read there first, past LazyObject's
# __getattribute__ (about as costly as the rest of this check); the attribute read when it is not there.
_MISSING = object()


def _payload_limit() -> int:
    global _limit
    raw = object.__getattribute__(settings, "__dict__").get("WEFT", _MISSING)
    if raw is _MISSING:
        raw = getattr(settings, "WEFT", None)
    given = raw.get("PAYLOAD_MAX_BYTES") if type(raw) is dict or isinstance(raw, Mapping) else None
    cached = _limit
    if cached is not None and cached[0] is raw and cached[1] == given:
        return cached[2]
    from weft_django.conf import payload_max_bytes

    value = payload_max_bytes()
    _limit = (raw, given, value)
    return value


def _expect(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise CorruptPayloadError(f"expected a JSON {kind.__name__}, found {_short(value)}")
    return value


def _decode_decimal(text: Any) -> Decimal:
    number = Decimal(_expect(text, str))
    if not number.is_finite():
        raise CorruptPayloadError(f"Decimal {text!r} is not finite")
    return number


def _decode_clock(kind: type[datetime] | type[time]) -> Callable[[Any], Any]:
    def decode_clock(text: Any) -> Any:
        text, _, key = _expect(text, str).partition("[")
        value = kind.fromisoformat(text)
        if text[-16:-15] in ("+", "-") and text[-15:-6] == "00:00:00.":  # 3.11 reads "+00:00:00.000001" as UTC
            sign = -1 if text[-16] == "-" else 1
            value = value.replace(tzinfo=timezone(timedelta(microseconds=sign * int(text[-6:]))))
        if not key:
            return value
        if not key.endswith("]"):
            raise CorruptPayloadError(f"time zone suffix {key!r} has no closing ']'")
        zone = ZoneInfo(key[:-1])
        if value.tzinfo is None:
            return value.replace(tzinfo=zone)
        if not portable_zone(zone.key):  # "[localtime]", written before such keys were normalised:
            return value  # the stored offset keeps the instant on every machine, whatever zone it has
        wall = value.replace(tzinfo=zone)
        # The stored offset says which side of a DST fold (or gap) the wall time was on.
        return wall if wall.utcoffset() == value.utcoffset() else wall.replace(fold=1)

    return decode_clock


def _decode_timedelta(parts: Any) -> timedelta:
    if type(parts) is not list or len(parts) != 3 or any(type(part) is not int for part in parts):
        raise CorruptPayloadError(f"{_short(parts)} is not [days, seconds, microseconds]")
    return timedelta(*parts)


def _decode_pairs(pairs: Any) -> dict[Any, Any]:
    for pair in _expect(pairs, list):
        if type(pair) is not list or len(pair) != 2:
            raise CorruptPayloadError(f"dict entry {_short(pair)} is not a [key, value] pair")
    return {key: item for key, item in pairs}


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "tuple": lambda items: tuple(_expect(items, list)),
    "set": lambda items: set(_expect(items, list)),
    "frozenset": lambda items: frozenset(_expect(items, list)),
    "dict": _decode_pairs,
    "bytes": lambda text: base64.b64decode(_expect(text, str), validate=True),
    "decimal": _decode_decimal,
    "uuid": lambda text: UUID(_expect(text, str)),
    "date": lambda text: date.fromisoformat(_expect(text, str)),
    "time": _decode_clock(time),
    "datetime": _decode_clock(datetime),
    "timedelta": _decode_timedelta,
}


def _untag(obj: dict[str, Any]) -> Any:
    if TAG not in obj:
        return obj
    tag = obj[TAG]
    decoder = _DECODERS.get(tag) if type(tag) is str else None
    if decoder is None or len(obj) != 2 or "v" not in obj:
        raise CorruptPayloadError(f"malformed tagged value {_short(obj)}; expected {{{TAG!r}: tag, 'v': …}}")
    try:
        return decoder(obj["v"])
    except CorruptPayloadError as exc:
        raise CorruptPayloadError(f"tagged {tag!r} value: {exc}") from None
    # KeyError: unknown ZoneInfo key; OSError: a key naming a file ZoneInfo cannot read
    except (ValueError, TypeError, KeyError, ArithmeticError, OSError) as exc:
        raise CorruptPayloadError(f"tagged {tag!r} value {_short(obj['v'])} is invalid: {exc}") from None


def _refuse_constant(name: str) -> Any:
    raise CorruptPayloadError(f"{name} is not valid codec output; NaN and infinities are never encoded")


_decode_json = json.JSONDecoder(object_hook=_untag, parse_constant=_refuse_constant).decode


_CONSTANTS: dict[str, Any] = {"null": None, "true": True, "false": False}


def decode(text: str | None) -> Any:
    """Decode codec text (None stays None). Raises CorruptPayloadError for anything else."""
    if text is None:
        return None
    if type(text) is str and len(text) < 19:  # the JSON constants and small non-negative ints, without the parser
        if text in _CONSTANTS:
            return _CONSTANTS[text]
        if text.isdigit() and text.isascii() and (text[0] != "0" or len(text) == 1):
            return int(text)
    if not isinstance(text, str):
        raise CorruptPayloadError(f"Corrupt payload: codec text is a str, not {type(text).__name__} {_short(text)}")
    try:
        return _decode_json(text)
    except CorruptPayloadError as exc:
        raise CorruptPayloadError(f"Corrupt payload: {exc}") from None
    except ValueError as exc:
        raise CorruptPayloadError(f"Corrupt payload: not valid JSON ({exc}): {_short(text)}") from None
    except RecursionError:
        raise CorruptPayloadError(f"Corrupt payload: nested too deeply to decode: {_short(text)}") from None
