"""The duration options of the command line take what their refusals offer.

``weft query/update --timeout`` and ``weft purge --older-than`` refused "30" with "the duration must be
a duration: a timedelta, a number of seconds, or a string such as "500ms", "30s" ..." (the message of
the Python API): a number of seconds was offered and refused, a timedelta offered that no command
line can pass. They take a number of seconds now, and their refusal names only the command line's forms.

``weft_engine --drain-timeout`` said "must be a number of seconds, 0 or more" and refused 1e300 (a
number of seconds, 0 or more: it waited at most what a thread can wait, while "inf" was taken).
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import weft_django as weft
from weft_django.management.commands.weft_engine import Command as EngineCommand
from weft_django.models import Workflow
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db


def weft_cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_duration_refusal_offers_only_what_the_command_line_takes() -> None:
    with pytest.raises(CommandError) as refused:
        weft_cli("purge", "--older-than", "soon", "--dry-run")
    message = str(refused.value)
    assert 'a number of seconds ("30", "0.5")' in message and "timedelta" not in message
    with pytest.raises(CommandError, match="must be at most 100 years"):
        weft_cli("purge", "--older-than", "inf", "--dry-run")
    with pytest.raises(CommandError, match="must be a duration of 0 or more"):
        weft_cli("purge", "--older-than", "-1", "--dry-run")


def test_a_number_of_seconds_is_a_duration() -> None:
    weft.start("tests.sum", id="a-minute-ago", args=[1, 1])
    Workflow.objects.filter(pk="a-minute-ago").update(status="completed", finished_at=db_now() - timedelta(seconds=60))
    assert weft_cli("purge", "--older-than", "3600", "--dry-run").startswith("0 workflow(s)")
    assert weft_cli("purge", "--older-than", "30", "--yes").strip() == "Purged 1 workflow(s)."
    # --timeout takes it too: the unknown run is what is refused, not "0.1".
    with pytest.raises(CommandError) as refused:
        weft_cli("query", "nope", "stage", "--timeout", "0.1")
    assert "must be a duration" not in str(refused.value)


def test_a_drain_timeout_of_any_number_of_seconds_is_taken() -> None:
    parser = EngineCommand().create_parser("manage.py", "weft_engine")
    assert parser.parse_args(["--drain-timeout", "1e300"]).drain_timeout == 1e300
    assert parser.parse_args(["--drain-timeout", "inf"]).drain_timeout == float("inf")
    with pytest.raises(CommandError, match="must be a number of seconds, 0 or more"):
        parser.parse_args(["--drain-timeout", "-1"])
