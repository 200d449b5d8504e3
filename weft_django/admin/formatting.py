"""Text for people: durations, relative times, decoded payloads, status badges. No queries."""

from __future__ import annotations

import json
import pprint
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..codec import decode
from ..exceptions import CorruptPayloadError
from ..status import WorkflowStatus
from ..store.moments import UNREADABLE

_UNITS = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))


def format_duration(delta: timedelta | None) -> str:
    """A short human duration: "350 ms", "4.2 s", "3 m 10 s", "2 h 5 m", "3 d 4 h"."""
    if delta is None:
        return "-"
    seconds = abs(delta.total_seconds())
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    parts: list[str] = []
    for size, unit in _UNITS:
        if whole >= size:
            parts.append(f"{whole // size} {unit}")
            whole %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def relative(moment: datetime | None, now: datetime) -> str:
    """ "in 12 s" or "12 s ago" (or "-" for no moment)."""
    if moment is None:
        return "-"
    delta = moment - now
    text = format_duration(delta)
    return f"in {text}" if delta >= timedelta(0) else f"{text} ago"


def heartbeat_age(age: timedelta) -> str:
    """An engine's heartbeat age (the database clock minus the heartbeat): "12 s ago", or, for one in
    the future (a hand edit: no evidence of life, store/liveness.py), "365 d ahead of the database clock"."""
    if age < timedelta(0):
        return f"{format_duration(age)} ahead of the database clock"
    return f"{format_duration(age)} ago"


def pretty_payload(text: str | None) -> str:
    """Codec text decoded and pretty-printed as Python values (tuples, Decimals and datetimes stay
    what the workflow sees). Undecodable text is shown raw, with the reason."""
    if text is None:
        return "None"
    try:
        value = decode(text)
    except CorruptPayloadError as exc:
        return f"{exc}\n\n{text}"
    return pprint.pformat(value, width=100, sort_dicts=False)


def pretty_json(value: Any) -> str:
    """A JSON column (errors, issues) indented for reading; tracebacks are shown separately."""
    return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False, default=str)


def status_badge(status: str) -> SafeString:
    """The status as a coloured badge; a status weft does not know (an odd row) is shown as stored,
    marked "unknown status"."""
    try:
        label = WorkflowStatus(status).label
    except ValueError:
        return format_html(
            '<span class="weft-badge weft-odd" title="not a status weft knows: the row was edited by hand or '
            'written by another version">{} (unknown status)</span>',
            status,
        )
    return format_html('<span class="weft-badge weft-status-{}">{}</span>', status, label)


def status_text(status: str) -> str:
    """The status for plain text (``manage.py weft``): as stored, marked when weft does not know it."""
    return status if status in WorkflowStatus.values else f"{status} (unknown status)"


def local(value: datetime) -> datetime | None:
    """``value`` in the current time zone, or None when that is not a Python datetime (a timestamp
    within a day of year 1 or 9999: an odd row)."""
    try:
        return timezone.localtime(value)
    except (OverflowError, ValueError):
        return None


def when_text(value: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A timestamp as local time text ("-" for None); one out of the local time zone's range is
    shown in UTC, marked "out of range"."""
    if value is None:
        return "-"
    shown = local(value)
    if shown is None:
        return f"{value.astimezone(UTC).strftime(fmt)} UTC (out of range)"
    return shown.strftime(fmt)


def error_text(error: Any) -> str:
    """ "Type: message" of an error column for plain text; a value that is not a dict (an odd row) is
    shown as JSON, marked "not an error object"."""
    if isinstance(error, dict):
        return error_summary(error)
    return f"{pretty_json(error)} (not an error object)"


def state_badge(state: str, label: str | None = None) -> SafeString:
    """A badge for an engine or claim state: alive / stopped / dead, held / lapsed / released."""
    return format_html('<span class="weft-badge weft-state-{}">{}</span>', state, label or state)


def error_summary(error: Any) -> str:
    """ "Type: message" of an error dict (a run's, a step's, an update's)."""
    if not isinstance(error, dict):
        return "" if error is None else str(error)
    kind = error.get("type") or error.get("exc") or "Error"
    return f"{kind}: {error.get('message', '')}".strip()


def moment(value: datetime | None, *, short: bool = False) -> SafeString | str:
    """A timestamp to the second in the current time zone (``short``: without the year, for
    changelist columns); the full value on hover."""
    if value is None:
        return "-"
    text = when_text(value, "%m-%d %H:%M:%S" if short and local(value) is not None else "%Y-%m-%d %H:%M:%S")
    css = "weft-moment weft-odd" if local(value) is None else "weft-moment"
    return format_html('<span class="{}" title="{}">{}</span>', css, value.isoformat(), text)


def unreadable_moment(stored: str) -> SafeString:
    """A timestamp the row holds but Python cannot represent (``store.moments``), marked, with what it holds."""
    return format_html(
        '<span class="weft-moment weft-odd" title="stored as {}: not a time Python can represent (before year 1 '
        'or after 9999, or not a date), written by hand or by a bad migration; repair the column">{} ({})</span>',
        stored,
        UNREADABLE,
        stored,
    )


def moment_of(row: Any, name: str, *, short: bool = False) -> SafeString | str:
    """``moment`` of a row's timestamp field, or its ``unreadable_moment`` when the row was read with
    ``store.moments.readable_rows`` and that column could not be read."""
    stored = (getattr(row, "weft_unreadable", None) or {}).get(name)
    return unreadable_moment(stored) if stored is not None else moment(getattr(row, name), short=short)


def marked(row: dict[str, Any]) -> dict[str, Any]:
    """A row of ``store.moments.readable_values``, its damaged timestamps (None) replaced by their
    ``unreadable_moment`` (``|weft_moment`` shows it as it is)."""
    return {**row, **{name: unreadable_moment(stored) for name, stored in row.get("unreadable", {}).items()}}


def short_step(label: str | None) -> str | None:
    """ "#2 activity shop.charge_card" -> "#2 activity charge_card": the module path adds nothing in a list."""
    if not label:
        return label
    parts = label.split(" ", 2)
    if len(parts) == 3 and parts[1] == "activity":
        return f"{parts[0]} {parts[1]} {parts[2].rsplit('.', 1)[-1]}"
    return label


def claim_expiry_badge(expires_at: datetime, heartbeat: datetime | None, silent: bool, now: datetime) -> SafeString:
    """A held claim's expiry relative to ``now``, red when it lapsed: "lapsed ..." once expired, "lapsed:
    engine silent since ..." when its engine has been silent for longer than the TTL (``silent``, from
    ``store.claims.holder_silent``)."""
    if expires_at < now:
        return format_html(
            '<span class="weft-lapsed" title="{}">lapsed {}</span>', expires_at, relative(expires_at, now)
        )
    if silent and heartbeat is not None and heartbeat > now:
        return format_html(
            '<span class="weft-lapsed" title="expires {}">lapsed: engine heartbeat {}</span>',
            expires_at,
            heartbeat_age(now - heartbeat),
        )
    if silent:
        return format_html(
            '<span class="weft-lapsed" title="expires {}">lapsed: engine silent since {}</span>',
            expires_at,
            relative(heartbeat, now),
        )
    return format_html('<span title="{}">{}</span>', expires_at, relative(expires_at, now))
