"""weft_django.checks through Django's check framework: run_checks() and ``manage.py check``.

No test requests the database: pytest-django blocks it, so the checks are proved to run no query.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from tests.project.test_conf import CASES
from weft_django.checks import SQLITE_OPTIONS, is_sqlite, sqlite_problems

RUNNING_ON_SQLITE = "sqlite" in settings.DATABASES["default"]["ENGINE"]
# Overriding DATABASES warns that connections keep their settings; these checks read the settings only.
ignore_databases_warning = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")

SQLITE_COMPLETE = {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}


def sqlite(**options: Any) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "/tmp/weft-conf-unused.sqlite3",
        "OPTIONS": options,
    }


def weft_messages(**kwargs: Any) -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(**kwargs) if str(m.id).startswith("weft.")]


def expected_sqlite_ids() -> list[str]:
    """What the test settings' own database adds (the SQLite run's default is complete but still SQLite)."""
    return ["weft.W003"] if RUNNING_ON_SQLITE else []


def run_check_command() -> tuple[str, str]:
    """``manage.py check``: (the SystemCheckError text, or the warnings written to stderr)."""
    stderr = io.StringIO()
    try:
        call_command("check", stdout=io.StringIO(), stderr=stderr)
    except SystemCheckError as error:
        return str(error), stderr.getvalue()
    return "", stderr.getvalue()


def test_valid_settings_have_no_weft_errors() -> None:
    assert [m.id for m in weft_messages()] == expected_sqlite_ids()
    raised, _ = run_check_command()
    assert "weft." not in raised


@pytest.mark.parametrize("check_id", sorted(CASES))
def test_each_rule_through_run_checks(check_id: str) -> None:
    weft, message = CASES[check_id]
    with override_settings(WEFT=weft):
        found = [m for m in weft_messages() if m.obj == "settings.WEFT"]
    assert [(m.id, m.msg) for m in found] == [(check_id, message)]
    error = found[0]
    assert isinstance(error, checks.Error)
    assert error.hint
    assert error.obj == "settings.WEFT"


@pytest.mark.parametrize("check_id", sorted(CASES))
def test_each_rule_through_the_check_command(check_id: str) -> None:
    weft, message = CASES[check_id]
    with override_settings(WEFT=weft):
        raised, _ = run_check_command()
    assert f"settings.WEFT: ({check_id}) {message}" in raised
    assert "HINT: " in raised


def test_check_lists_every_broken_rule_at_once() -> None:
    weft = {
        "BACKGROUND_TASKS": "manual",
        "OWNERSHIP": "lease",
        "DETECT_SECOND_INSTANCE": True,
        "LEASE_TTL": "1s",
        "LEASE_RENEW_INTERVAL": "2s",
        "POLL_INTERVAL": 0,
        "ACTIVITY_EXECUTOR": "rq",
        "RETENTION": {"failed": "soon"},
        "PAYLOAD_MAX_BYTES": -1,
        "DATABASE": "elsewhere",
        "OWNERSHP": "none",
    }
    ids = ["weft.E011", "weft.E010", "weft.E004", "weft.E014", "weft.E017", "weft.E002"]
    ids += ["weft.E021", "weft.E022", "weft.E013"]
    with override_settings(WEFT=weft):
        assert [m.id for m in weft_messages()] == ids  # DATABASE is broken, so no SQLite checks
        raised, _ = run_check_command()
    for check_id in ids:
        assert f"({check_id})" in raised


def test_checks_are_tagged_weft() -> None:
    with override_settings(WEFT={"OWNERSHIP": "x"}):
        tagged = [m.id for m in checks.run_checks(tags=["weft"])]
        assert tagged[0] == "weft.E001"
        assert all(str(i).startswith("weft.") for i in tagged)
        assert "weft.E001" not in [m.id for m in checks.run_checks(tags=["models"])]


def test_invalid_durations_of_an_unused_mode_pass_check() -> None:
    weft = {"OWNERSHIP": "workflow-lease", "LEASE_TTL": "nope", "LEASE_RENEW_INTERVAL": "1h"}
    with override_settings(WEFT=weft):
        assert [m.id for m in weft_messages()] == expected_sqlite_ids()
    weft = {"OWNERSHIP": "lease", "WORKFLOW_CLAIM_TTL": "nope"}
    with override_settings(WEFT=weft):
        assert [m.id for m in weft_messages()] == expected_sqlite_ids()


def test_settings_changes_are_seen_by_the_next_check(settings: Any) -> None:
    settings.WEFT = {"OWNERSHIP": "x"}
    assert [m.id for m in weft_messages()][:1] == ["weft.E001"]
    settings.WEFT = {"OWNERSHIP": "none"}
    assert [m.id for m in weft_messages()] == expected_sqlite_ids()


# --- SQLite -----------------------------------------------------------------------------------


def test_sqlite_detection_imports_the_backend_only() -> None:
    assert is_sqlite(sqlite())
    assert not is_sqlite(POSTGRES)
    assert not is_sqlite({"ENGINE": "no.such.backend"})
    assert not is_sqlite({})


@ignore_databases_warning
@pytest.mark.parametrize(
    ("options", "ids"),
    [
        ({}, ["weft.E025", "weft.W001", "weft.W002", "weft.W003"]),
        (SQLITE_COMPLETE, ["weft.W003"]),
        ({**SQLITE_COMPLETE, "transaction_mode": "immediate"}, ["weft.W003"]),
        ({**SQLITE_COMPLETE, "transaction_mode": "DEFERRED"}, ["weft.E025", "weft.W003"]),
        ({**SQLITE_COMPLETE, "timeout": None}, ["weft.W001", "weft.W003"]),
        ({**SQLITE_COMPLETE, "init_command": "PRAGMA foreign_keys=ON;"}, ["weft.W002", "weft.W003"]),
        (
            {**SQLITE_COMPLETE, "init_command": "PRAGMA synchronous=1; pragma JOURNAL_MODE = wal"},
            ["weft.W003"],
        ),
    ],
)
def test_sqlite_options(options: dict[str, Any], ids: list[str]) -> None:
    with override_settings(DATABASES={"default": POSTGRES, "lite": sqlite(**options)}, WEFT={"DATABASE": "lite"}):
        assert [p.id for p in sqlite_problems("lite")] == ids
        found = weft_messages()
    assert [m.id for m in found] == ids
    assert all(m.obj == 'settings.DATABASES["lite"]' for m in found)
    assert [type(m) for m in found] == [checks.Error if i.startswith("weft.E") else checks.Warning for i in ids]


@ignore_databases_warning
def test_sqlite_messages_and_hints() -> None:
    with override_settings(DATABASES={"default": POSTGRES, "lite": sqlite()}, WEFT={"DATABASE": "lite"}):
        found = {m.id: m for m in weft_messages()}
    where = 'DATABASES["lite"]["OPTIONS"]'
    assert found["weft.E025"].msg == (
        'The SQLite database "lite" must set OPTIONS["transaction_mode"] to "IMMEDIATE": otherwise a '
        'transaction that reads before it writes fails with "database is locked" instead of waiting for '
        "the lock."
    )
    assert found["weft.E025"].hint == f"Set {where} = {SQLITE_OPTIONS}."
    assert SQLITE_OPTIONS == (
        '{"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}'
    )
    assert found["weft.W001"].hint == f'Add "timeout": 20 (seconds) to {where}.'
    assert found["weft.W002"].hint == f'Add "init_command": "PRAGMA journal_mode=WAL;" to {where}.'
    assert "PostgreSQL for more than one engine" in found["weft.W003"].hint
    assert "atomic=True activity holds the write lock" in found["weft.W003"].msg


@ignore_databases_warning
def test_only_the_weft_database_is_inspected() -> None:
    with override_settings(DATABASES={"default": POSTGRES, "lite": sqlite()}, WEFT={}):
        assert weft_messages() == []
    with override_settings(DATABASES={"default": POSTGRES}, WEFT={"DATABASE": "lite"}):
        assert [m.id for m in weft_messages()] == ["weft.E022"]


@ignore_databases_warning
def test_sqlite_ids_through_the_check_command() -> None:
    with override_settings(DATABASES={"default": POSTGRES, "lite": sqlite()}, WEFT={"DATABASE": "lite"}):
        raised, _ = run_check_command()
    for check_id in ("weft.E025", "weft.W001", "weft.W002", "weft.W003"):
        assert f'settings.DATABASES["lite"]: ({check_id})' in raised


@ignore_databases_warning
def test_sqlite_warnings_alone_do_not_fail_check() -> None:
    databases = {"default": POSTGRES, "lite": sqlite(transaction_mode="IMMEDIATE")}
    with override_settings(DATABASES=databases, WEFT={"DATABASE": "lite"}):
        raised, warned = run_check_command()
    assert raised == ""
    for check_id in ("weft.W001", "weft.W002", "weft.W003"):
        assert f'settings.DATABASES["lite"]: ({check_id})' in warned


@ignore_databases_warning
def test_silenced_sqlite_warning() -> None:
    with override_settings(
        DATABASES={"default": POSTGRES, "lite": sqlite(**SQLITE_COMPLETE)},
        WEFT={"DATABASE": "lite"},
        SILENCED_SYSTEM_CHECKS=["weft.W003"],
    ):
        raised, warned = run_check_command()
    assert (raised, warned) == ("", "")
