"""The checks every text, duration and moment a caller hands weft goes through before anything is
written: workflow and schedule ids, signal ids and idempotency keys, signal, update and query names,
cancel reasons and schedule notes (the client, schedules, the admin's forms and ``manage.py weft``
all call these).

Text must be a ``str`` within its length bound, with no NUL character (PostgreSQL cannot store one:
a raw ``DataError`` used to escape) and no lone surrogate (it cannot be encoded as UTF-8: a raw
``UnicodeEncodeError`` used to escape). Ids also refuse every other control character. Durations
are bounded by ``durations.MAX_DURATION``; a ``start_at`` moment by the same bound from now, so a
deadline computed from it is always a valid date. Time zone keys that schedules take and the codec
keeps by name must be IANA names, the same zone on every machine (``portable_zone``).
"""

from __future__ import annotations

import functools
import unicodedata
import zoneinfo
from datetime import UTC, datetime, timedelta

from .durations import MAX_DURATION, MAX_DURATION_TEXT, InvalidDuration, to_nonnegative_timedelta
from .exceptions import InvalidArgumentError, InvalidWorkflowIdError

MAX_ID_LENGTH = 255
MAX_KEY_LENGTH = 320  # signal ids and idempotency keys; an activity_info().idempotency_key fits
MAX_NAME_LENGTH = 255
MAX_REASON_LENGTH = 1000  # cancel reasons (stored with the run, shown in the admin and `weft describe`)
MAX_NOTE_LENGTH = 1000  # a schedule's pause note
# Keys a time zone database answers with the machine's own settings, not a zone of the IANA database:
# Debian and others link "localtime" to /etc/localtime (the machine's zone; Python 3.11 to 3.13 list it
# among available_timezones() there, CPython issue 137976), and "posixrules" is the zone an installation
# chose for POSIX TZ strings.
MACHINE_ZONES = frozenset({"localtime", "posixrules"})


def check_text(
    value: object,
    name: str,
    *,
    max_length: int,
    min_length: int = 1,
    controls: bool = False,
    error: type[InvalidArgumentError] = InvalidArgumentError,
    hint: str = "",
) -> str:
    """Return ``value`` if it is text weft can store, else raise ``error`` (an InvalidArgumentError).

    ``name`` is the argument's name in the messages; ``min_length`` / ``max_length`` bound its length
    in characters; ``controls`` refuses every control character (ids), not only NUL; ``hint`` is
    appended to the length and type messages. Raises ``error`` for a non-str, a length out of bounds,
    a NUL (or, with ``controls``, any control) character, or a lone surrogate.
    """
    if not isinstance(value, str) or not min_length <= len(value) <= max_length:
        shown = f"{len(value)} characters" if isinstance(value, str) else f"{type(value).__name__}: {value!r:.80}"
        size = f"at most {max_length}" if min_length == 0 else f"{min_length} to {max_length}"
        raise error(f"{name} must be a str of {size} characters (got {shown}).{hint}")
    if controls:
        for index, char in enumerate(value):
            if unicodedata.category(char) == "Cc":
                raise error(
                    f"{name} must not contain control characters (found {char!r} at index {index}); "
                    f"remove it from {value!r:.80}."
                )
    if "\x00" in value:
        raise error(
            f"{name} must not contain NUL characters (found one at index {value.index(chr(0))}); the "
            f"database cannot store them. Remove it from {value!r:.80}."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{name} must be valid Unicode text: it has a lone surrogate {value[exc.start]!r} at index "
            f"{exc.start}, which cannot be encoded as UTF-8 (text decoded with errors='surrogateescape' or "
            f"a broken UTF-16 pair). Decode the bytes properly or remove it."
        ) from None
    return value


@functools.lru_cache(maxsize=512)
def portable_zone(key: str) -> bool:
    """Whether ``key`` names a zone of the IANA time zone database, the same rules on every machine that
    has it, and loads here: listed by ``zoneinfo.available_timezones()`` (not "posixrules", the
    "posix/" and "right/" copies some machines lack, nor a case variant a case-insensitive file system
    loads), and not "localtime" (the machine's own zone). Schedules refuse other keys, and the codec
    keeps only their UTC offset: another machine reads them as another zone, or not at all."""
    if key in MACHINE_ZONES or key not in _zone_names():
        return False
    try:
        zoneinfo.ZoneInfo(key)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


@functools.cache
def _zone_names() -> frozenset[str]:
    """``zoneinfo.available_timezones()``, read once (it walks the time zone directories)."""
    return frozenset(zoneinfo.available_timezones())


def validate_workflow_id(value: object, name: str = "id") -> str:
    """Return ``value`` if it is a valid workflow id: a str of 1 to 255 characters, no control
    characters, no lone surrogates. Raises InvalidWorkflowIdError otherwise."""
    if isinstance(value, str) and not 1 <= len(value) <= MAX_ID_LENGTH:
        raise InvalidWorkflowIdError(
            f"{name} must be 1 to {MAX_ID_LENGTH} characters long (got {len(value)}); use a shorter, non-empty id."
        )
    return check_text(value, name, max_length=MAX_ID_LENGTH, controls=True, error=InvalidWorkflowIdError)


def validate_key(value: object, name: str) -> str:
    """A signal id or an idempotency key (``name`` in messages): a str of 1 to 320 characters with no
    NUL or lone surrogate. Raises InvalidArgumentError otherwise."""
    return check_text(value, name, max_length=MAX_KEY_LENGTH)


def validate_name(value: object, name: str) -> str:
    """A signal, update or query name (``name`` in messages): a str of 1 to 255 characters with no NUL
    or lone surrogate. Raises InvalidArgumentError otherwise."""
    return check_text(value, name, max_length=MAX_NAME_LENGTH)


# The signal names a child's end record takes in its parent's mailbox (store/mailbox.py): reserved.
CHILD_MAILBOX_PREFIX = "__weft_child__:"


def validate_signal_name(value: object, name: str) -> str:
    """A signal name a caller sends: as ``validate_name``, and not one a child's end record takes in
    its parent's mailbox (``__weft_child__:<seq>``), which the parent would consume as that child's
    end. Raises InvalidArgumentError otherwise."""
    text = validate_name(value, name)
    if text.startswith(CHILD_MAILBOX_PREFIX):
        raise InvalidArgumentError(
            f"{name} {text[:60]!r} begins with {CHILD_MAILBOX_PREFIX!r}, which weft reserves for the end "
            f"records of child workflows. Use another name."
        )
    return text


def validate_reason(value: object) -> str | None:
    """A cancel reason: None, or a str of at most 1000 characters with no NUL or lone surrogate.
    Raises InvalidArgumentError otherwise (an object is not turned into its repr)."""
    if value is None:
        return None
    return check_text(
        value,
        "reason",
        min_length=0,
        max_length=MAX_REASON_LENGTH,
        hint=" Pass a short sentence; keep longer details in your own records.",
    )


def validate_note(value: object, error: type[InvalidArgumentError] = InvalidArgumentError) -> str:
    """A schedule's pause note: a str (may be empty) of at most 1000 characters with no NUL or lone
    surrogate. Raises ``error`` otherwise."""
    return check_text(value, "note", min_length=0, max_length=MAX_NOTE_LENGTH, error=error)


def duration(value: object, name: str, *, positive: bool = False) -> timedelta:
    """``value`` as a non-negative timedelta of at most ``durations.MAX_DURATION`` (``positive``: more
    than zero). Raises InvalidArgumentError naming ``name`` (and the bound, when it is too long)."""
    try:
        result = to_nonnegative_timedelta(value, name)
    except InvalidDuration as exc:
        raise InvalidArgumentError(str(exc)) from None
    if positive and result <= timedelta(0):
        raise InvalidArgumentError(f"{name} must be greater than zero (got {value!r}).")
    return result


def start_moment(value: object, name: str = "start_at") -> datetime:
    """A timezone-aware datetime at most ``durations.MAX_DURATION`` from now (by this machine's clock;
    the bound is a century, so clock skew does not matter). Raises InvalidArgumentError otherwise."""
    if not isinstance(value, datetime):
        raise InvalidArgumentError(f"{name} must be a datetime (got {type(value).__name__}: {value!r}).")
    if value.utcoffset() is None:
        raise InvalidArgumentError(
            f"{name} must be timezone-aware (got the naive {value!r}); use "
            f"django.utils.timezone.make_aware() or pass tzinfo."
        )
    latest = datetime.now(UTC) + MAX_DURATION
    if value > latest:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_DURATION_TEXT} from now, weft_django.durations.MAX_DURATION "
            f"(got {value.isoformat()}, latest accepted {latest:%Y-%m-%d}). The bound keeps the run's "
            f"deadline and timers valid dates; pass an earlier moment."
        )
    return value


def is_storable(text: str) -> bool:
    """Whether ``text`` can be stored as it is in a text or jsonb column: no NUL, no unpaired surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = [
    "CHILD_MAILBOX_PREFIX",
    "MACHINE_ZONES",
    "MAX_ID_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_NOTE_LENGTH",
    "MAX_REASON_LENGTH",
    "check_text",
    "duration",
    "is_storable",
    "portable_zone",
    "start_moment",
    "validate_key",
    "validate_name",
    "validate_note",
    "validate_reason",
    "validate_signal_name",
    "validate_workflow_id",
]
