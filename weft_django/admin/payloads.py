"""JSON typed by an operator (admin forms, ``manage.py weft``) turned into a payload, validated
before anything is written: JSON syntax first, then weft's codec tags, then the codec's limits."""

from __future__ import annotations

import json
from typing import Any

from ..codec import MAX_DEPTH, decode, encode_payload
from ..exceptions import CorruptPayloadError, PayloadNotSerializableError, PayloadSizeExceededError


class PayloadInputError(ValueError):
    """The text is not a payload weft can store; the message says why."""


def parse_payload(text: str | None, what: str = "payload") -> Any:
    """The value of JSON ``text`` (empty or None means None). Tagged values such as
    ``{"$weft": "decimal", "v": "12.00"}`` decode to their Python types."""
    if text is None or not text.strip():
        return None
    try:
        json.loads(text)
    except ValueError as exc:
        raise PayloadInputError(f"{what} is not valid JSON: {exc}.") from None
    except RecursionError:  # nested deeper than the parser recurses (the codec allows MAX_DEPTH)
        raise PayloadInputError(f"{what} is nested more than {MAX_DEPTH} containers deep.") from None
    try:
        value = decode(text)
    except CorruptPayloadError as exc:
        message = str(exc).removeprefix("Corrupt payload: ")
        raise PayloadInputError(f"{what} cannot be used: {message}.") from None
    try:
        encode_payload(value, path=what)
    except (PayloadNotSerializableError, PayloadSizeExceededError) as exc:
        raise PayloadInputError(str(exc)) from None
    return value
