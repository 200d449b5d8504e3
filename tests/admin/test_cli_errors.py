"""manage.py weft and weft_engine on bad input a shell can pass, as a Django developer meets them: each
refusal is a CommandError (one line on stderr, exit 1 or argparse's 2, no traceback) that names the
problem, and nothing is written. Found in an independent review of the command line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

import weft_django as weft
from weft_django.models import Engine, Workflow

ROOT = Path(__file__).resolve().parents[2]
HUGE = "9" * 23  # beyond a 64-bit LIMIT
NUL = "a\x00b"
SURROGATE = "a\udcffb"  # what a non-UTF-8 byte in argv becomes (surrogateescape)


def weft_cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize("subcommand", ["list", "claims"])
def test_a_limit_beyond_the_databases_range_is_refused(db, subcommand):
    with pytest.raises(CommandError, match="--limit: must be a whole number from 1 to"):
        weft_cli(subcommand, "--limit", HUGE)


@pytest.mark.parametrize(("value", "fragment"), [(NUL, "NUL"), (SURROGATE, "surrogate"), ("a" * 256, "255")])
def test_list_type_is_checked_like_every_other_name(db, value, fragment):
    with pytest.raises(CommandError, match=f"--type.*{fragment}"):
        weft_cli("list", "--type", value)


@pytest.mark.django_db(transaction=True)
def test_export_to_a_path_that_cannot_be_written_is_a_command_error(tmp_path):
    weft.start("tests.sum", id="exported", args=[1, 2])
    target = tmp_path / "missing" / "out.json"
    with pytest.raises(CommandError, match=r"--output .*cannot write.*No such file"):
        weft_cli("export", "exported", "--output", str(target))
    assert not target.exists()


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"])
def test_replay_since_a_time_outside_utc_years_is_refused(db, since):
    with pytest.raises(CommandError, match="--since .*outside years 1-9999 in UTC"):
        weft_cli("replay", "--since", since)


# ----------------------------------------------------------------------------------------- weft_engine


def run_django(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m django ...`` against this test's database (or ``extra_env``'s), killed with its
    children if it outlives the timeout (an engine the command should have refused to start)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    env["WEFT_SQLITE_PATH" if connection.vendor == "sqlite" else "WEFT_PG_NAME"] = str(connection.settings_dict["NAME"])
    env.update(extra_env or {})
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += "\n(killed: still running after 60 s)"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def assert_refused(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert done.returncode in (1, 2), done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert re.search(fragment, done.stderr), done.stderr[-2000:]


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("engine_id", "fragment"), [("e" * 256, "255"), ("a\udcffb", "surrogate"), ("a\nb", "control"), ("", "1 to 255")]
)
@pytest.mark.django_db(transaction=True)
def test_engine_id_is_checked_before_anything_is_written(engine_id, fragment):
    assert_refused(run_django("weft_engine", "--once", "--engine-id", engine_id), f"--engine-id.*{fragment}")
    assert not Engine.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_engine_id_with_nul_is_refused():  # argv cannot carry a NUL: call_command can
    with pytest.raises(CommandError, match=r"--engine-id must not contain control characters \(found '\\x00'"):
        call_command("weft_engine", "--once", "--engine-id", NUL, stdout=StringIO(), stderr=StringIO())
    assert not Engine.objects.exists()


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_engine_id_leaves_room_for_the_process_suffix():
    done = run_django("weft_engine", "--processes", "2", "--engine-id", "e" * 250)
    assert_refused(done, "--engine-id .*--processes")
    assert not Engine.objects.exists()


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--concurrency", "0", "--concurrency: must be a whole number of at least 1"),
        ("--processes", "many", "--processes: must be a whole number from 1 to"),
        ("--processes", "100000", "--processes: must be a whole number from 1 to .* run weft_engine on more machines"),
        ("--drain-timeout", "nan", "--drain-timeout: must be a number of seconds"),
        ("--drain-timeout", "-1", "--drain-timeout: must be a number of seconds"),
        ("--status-interval", "nan", "--status-interval: must be a number of seconds"),
        ("--status-interval", "inf", "--status-interval: must be a number of seconds"),
        ("--status-interval", "1e300", "--status-interval: must be a number of seconds"),
        ("--metrics-port", "99999", "--metrics-port: must be a port number from 0 to 65535"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_engine_numbers_are_refused_with_what_is_expected(option, value, fragment):
    assert_refused(run_django("weft_engine", "--once", f"{option}={value}"), fragment)
    assert not Engine.objects.exists()


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--force", "--once"], "--force only applies to --reset-ownership-mode"),
        (["--reset-ownership-mode", "--once"], "--reset-ownership-mode .* drop --once"),
        (["--reset-ownership-mode", "--processes", "3"], "--reset-ownership-mode .* drop --processes"),
        (["--reset-ownership-mode", "--queues", "emails"], "--reset-ownership-mode .* drop --queues"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_engine_options_that_do_not_go_together_are_refused(args, fragment):
    assert_refused(run_django("weft_engine", *args), fragment)
    assert not Engine.objects.exists()


# ----------------------------------------------------------------------------------- database down


def _unreachable_database() -> dict[str, str]:
    """Environment for tests/settings.py pointing the default database where nothing answers."""
    if connection.vendor == "sqlite":
        return {"WEFT_SQLITE_PATH": "/nonexistent-weft-dir/db.sqlite3"}
    with socket.socket() as probe:  # a port nothing listens on (bound, then closed)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {"WEFT_PG_PORT": str(port), "WEFT_PG_NAME": str(connection.settings_dict["NAME"])}


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args",
    [
        ["weft", "list"],
        ["weft", "describe", "x"],
        ["weft", "start", "tests.sum", "--args", "[1, 2]"],
        ["weft", "signal", "x", "go"],
        ["weft", "purge", "--dry-run"],
        ["weft", "replay"],
        ["weft_engine", "--once"],
        ["weft_engine", "--reset-ownership-mode"],
    ],
    ids=lambda args: " ".join(args),
)
def test_an_unreachable_database_is_one_line_not_a_traceback(db, args):
    done = run_django(*args, extra_env=_unreachable_database())
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "CommandError: Cannot reach the database" in done.stderr, done.stderr[-2000:]
    assert "manage.py weft doctor" in done.stderr
    assert not Workflow.objects.exists()
