"""What the Schedule admin shows of a row: its timing in one line, its next fire times and its active
runs. A row edited by hand whose timing cannot be used shows why (UnusableScheduleError's message)
instead of its fire times; its active runs are read separately and listed all the same."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import schedules
from ..conf import database_alias
from ..exceptions import UnusableScheduleError
from ..models import Schedule
from .formatting import format_duration


def _every_text(seconds: int) -> str:
    """ "90s", "5m", "2h", "1d": the largest unit that divides the interval."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def spec_summary(row: Schedule) -> str:
    """ "cron 30 2 * * * (Europe/Berlin)" or "every 1h", with the jitter when there is one."""
    text = f"cron {row.cron} ({row.timezone})" if row.cron else f"every {_every_text(row.every or 0)}"
    if row.jitter_ms:
        text += f", jitter < {format_duration(timedelta(milliseconds=row.jitter_ms))}"
    return text


def next_fires_html(row: Schedule, now: datetime) -> SafeString | str:
    """The next five fire times (UTC) after ``now``; for a row whose timing cannot be used, the reason."""
    try:
        schedules.check_timing_readable(row)  # a next fire time Python cannot represent (a hand edit)
        times = schedules.next_fire_times(row, now)
    except UnusableScheduleError as exc:
        return format_html('<span class="weft-error-text weft-odd">Cannot fire: {}</span>', str(exc))
    if not times:
        return "- (paused)" if row.paused else "-"
    return format_html_join(", ", "<code>{}</code>", ((t.strftime("%Y-%m-%d %H:%M:%S"),) for t in times))


def runs_html(row: Schedule, site_name: str) -> SafeString | str:
    """Links to the schedule's active runs (running, pending or suspended), oldest first."""
    ids = [run["id"] for run in schedules.active_runs(row.pk, database_alias())]
    if not ids:
        return "-"
    name = f"{site_name}:weft_django_workflow_change"
    return format_html_join(", ", '<a href="{}">{}</a>', ((reverse(name, args=[quote(i)]), i) for i in ids))
