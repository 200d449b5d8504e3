"""weft_engine --processes N is bounded: at most 4 engine processes per CPU core of the machine,
refused when the options are parsed (nothing read, written or forked), and on PostgreSQL at most what
the server's max_connections holds at 4 connections per engine, refused before the fork.

Before the fix any N of at least 1 was taken: a probe with --processes 100000 forked engines until
PostgreSQL refused connections ("sorry, too many clients already") to them and to every other client.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from weft_django.management.commands.weft_engine import Command
from weft_django.models import Engine

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = (os.cpu_count() or 1) * 4  # docs/operations.md: 4 per CPU core


def children() -> set[str]:
    """The pids of this process's children (Linux: /proc)."""
    tasks = Path("/proc/self/task")
    return {pid for task in tasks.iterdir() for pid in (task / "children").read_text().split()}


def test_a_process_count_above_four_per_core_is_refused_when_parsed() -> None:
    parser = Command().create_parser("manage.py", "weft_engine")
    assert parser.parse_args(["--processes", str(LIMIT)]).processes == LIMIT
    for value in (str(LIMIT + 1), "100000"):
        with pytest.raises(CommandError, match=f"from 1 to {LIMIT}, 4 per CPU core of this machine"):
            parser.parse_args(["--processes", value])


# OWNERSHIP "lease" refuses --processes too, but only after the settings and the migrations are read:
# the count is refused first, and this test never forks engines on code without the bound.
@override_settings(WEFT={"OWNERSHIP": "lease"})
def test_too_many_processes_are_refused_before_anything_is_read_written_or_started() -> None:
    before = children()
    refusal = f"--processes: must be a whole number from 1 to {LIMIT}"
    with CaptureQueriesContext(connection) as queries, pytest.raises(CommandError, match=refusal) as refused:
        call_command("weft_engine", "--processes", "100000")
    assert "run weft_engine on more machines" in str(refused.value)
    assert len(queries) == 0
    assert not Engine.objects.exists()
    assert children() == before


@pytest.mark.postgres
def test_more_processes_than_the_servers_connections_hold_are_refused() -> None:
    from weft_django.management.engine_processes import connection_shortfall

    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        (max_connections,) = cursor.fetchone()
    assert connection_shortfall(2, "default") is None
    message = connection_shortfall(int(max_connections), "default")
    assert message is not None
    assert message.startswith(f"--processes {max_connections} needs at least {4 * int(max_connections)} database")
    assert "or raise max_connections" in message


@pytest.mark.sqlite
def test_sqlite_has_no_connection_bound() -> None:
    from weft_django.management.engine_processes import connection_shortfall

    assert connection_shortfall(10**6, "default") is None
