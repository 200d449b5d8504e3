"""Search attributes: their declared types and the checks of their values (a leaf: no database).

A workflow declares its attributes (``@weft.workflow(attributes={"customer": str, "amount": float})``);
``ctx.set_attributes(...)`` and ``weft.start(..., attributes=...)`` check every value here before
anything is queued or written. A value is stored in one typed column of ``WorkflowAttribute``
(``store/visibility.py``); ``kind`` names which:

======== =============================== ==========
kind     declared as                     column
======== =============================== ==========
str      ``str``                         str_value
keywords ``list[str]``, ``list``         str_value (one row per element)
int      ``int``                         num_value
float    ``float``                       num_value
bool     ``bool``                        bool_value
datetime ``datetime``                    time_value
======== =============================== ==========
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .exceptions import InvalidSearchAttributeError, WorkflowDefinitionError

MAX_NAME_LENGTH = 100
MAX_TEXT_LENGTH = 500  # a str or keyword value (a btree entry stays far below PostgreSQL's limit)
MAX_KEYWORDS = 100  # elements of one keyword list
MAX_EXACT_INT = 2**53  # ints are stored as float8: exact up to here
KINDS = ("str", "keywords", "int", "float", "bool", "datetime")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_BY_TYPE: dict[Any, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    datetime: "datetime",
    list: "keywords",
}

# A checked value: (kind, value) where value is str | int | float | bool | datetime | tuple[str, ...];
# None clears the attribute.
Checked = tuple[str, Any] | None


def declare(attributes: Mapping[str, Any] | None, where: str) -> dict[str, str]:
    """The kinds of a workflow's declared attributes (name -> kind).

    Args:
        attributes: name -> ``str``, ``int``, ``float``, ``bool``, ``datetime``, ``list[str]`` (or the
            kind's name as a string).
        where: the workflow's name, for messages.

    Raises:
        WorkflowDefinitionError: a name is not an identifier (letters, digits, ``_``, no ``__``, at
            most 100 characters) or a type is not one of the above.
    """
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise WorkflowDefinitionError(f'Workflow "{where}": attributes must be a dict of name -> type.')
    kinds: dict[str, str] = {}
    for name, declared in attributes.items():
        if not _valid_name(name):
            raise WorkflowDefinitionError(
                f'Workflow "{where}": search attribute name {name!r} must start with a letter, hold only letters, '
                f'digits and single underscores ("__" separates a filter\'s operator), at most {MAX_NAME_LENGTH} '
                f"characters."
            )
        kind = _kind_of(declared)
        if kind is None:
            raise WorkflowDefinitionError(
                f'Workflow "{where}": search attribute "{name}" has type {declared!r}; use str, int, float, bool, '
                f"datetime or list[str] (a keyword list)."
            )
        kinds[name] = kind
    return kinds


def _valid_name(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and bool(_NAME.match(name)) and "__" not in name


def _kind_of(declared: Any) -> str | None:
    if isinstance(declared, str):
        return declared if declared in KINDS else None
    if typing.get_origin(declared) is list:
        return "keywords" if typing.get_args(declared) in ((str,), ()) else None
    return _BY_TYPE.get(declared)


def check_values(declared: Mapping[str, str], values: Mapping[str, Any], where: str) -> dict[str, Checked]:
    """Check ``values`` against the declared kinds; returns name -> (kind, value), or None to clear.

    Raises:
        InvalidSearchAttributeError: a name is not declared, or a value is not of its declared type
            (the message names both and what to pass).
    """
    if not isinstance(values, Mapping):
        raise InvalidSearchAttributeError(
            f"{where}: attributes must be a dict of name -> value (got {_shown(values)})."
        )
    checked: dict[str, Checked] = {}
    for name, value in values.items():
        kind = declared.get(name) if isinstance(name, str) else None
        if kind is None:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidSearchAttributeError(
                f"{where}: search attribute {_shown(name)} is not declared on this workflow (declared: {known}). "
                f"Add it to @weft.workflow(attributes={{...}})."
            )
        checked[name] = None if value is None else (kind, check_value(kind, value, f"{where}: attribute {name!r}"))
    return checked


def check_value(kind: str, value: Any, what: str) -> Any:
    """``value`` as stored for ``kind`` (a keyword list becomes a tuple).

    Raises:
        InvalidSearchAttributeError: the value is not of ``kind`` (or out of its bounds).
    """
    if kind == "str":
        return _text(value, what)
    if kind == "keywords":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise InvalidSearchAttributeError(
                f"{what} is a keyword list: pass a list of strings (got {_shown(value)})."
            )
        if len(value) > MAX_KEYWORDS:
            raise InvalidSearchAttributeError(f"{what} has {len(value)} keywords; at most {MAX_KEYWORDS}.")
        return tuple(dict.fromkeys(_text(item, f"{what}[{i}]") for i, item in enumerate(value)))
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidSearchAttributeError(f"{what} is a bool: pass True or False (got {_shown(value)}).")
        return value
    if kind == "datetime":
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise InvalidSearchAttributeError(
                f"{what} is a datetime: pass an aware datetime, e.g. django.utils.timezone.now() (got {_shown(value)})."
            )
        try:
            value.astimezone(UTC)
        except OverflowError:  # its UTC instant is before year 1 or after 9999: no column or reader holds it
            raise InvalidSearchAttributeError(
                f"{what} is {value.isoformat()}, which is outside years 1-9999 in UTC; pass a moment inside them."
            ) from None
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSearchAttributeError(
            f"{what} is {'an int' if kind == 'int' else 'a float'} (got {_shown(value)})."
        )
    if kind == "int":
        if not isinstance(value, int):
            raise InvalidSearchAttributeError(f"{what} is an int: pass a whole number (got {_shown(value)}).")
        if abs(value) > MAX_EXACT_INT:
            raise InvalidSearchAttributeError(f"{what}: an int attribute holds at most +/-2**53 (got {_shown(value)}).")
        return value
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float8's range
        number = math.inf
    if not math.isfinite(number):
        raise InvalidSearchAttributeError(f"{what} is a float: pass a finite number (got {_shown(value)}).")
    return number


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut to 60 characters. An int with more digits than
    ``sys.get_int_max_str_digits()`` has no repr (ValueError): such a value is named by its type."""
    try:
        return f"{value!r:.60}"
    except ValueError:
        return f"<{type(value).__name__} too large to show>"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidSearchAttributeError(f"{what} is text: pass a str (got {_shown(value)}).")
    if len(value) > MAX_TEXT_LENGTH or "\x00" in value:
        raise InvalidSearchAttributeError(
            f"{what}: text attributes hold at most {MAX_TEXT_LENGTH} characters and no NUL "
            f"(got {len(value)} characters)."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSearchAttributeError(f"{what} holds a lone surrogate, which cannot be stored.") from None
    return value


def merge(updates: list[dict[str, Checked]]) -> dict[str, Checked]:
    """Several ``set_attributes`` calls in the order they were made: the last value of a name wins."""
    merged: dict[str, Checked] = {}
    for update in updates:
        merged.update(update)
    return merged


__all__ = ["KINDS", "Checked", "check_value", "check_values", "declare", "merge"]
