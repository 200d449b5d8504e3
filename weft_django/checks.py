"""System checks: every broken WEFT rule (``conf.problems()``) and the SQLite setup weft needs.

Registered when this module is imported (``WeftConfig.ready()``), tagged ``weft``. No check opens
a connection or runs a query: the SQLite checks read the ``DATABASES`` entry only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import load_backend

from . import conf
from .conf import SettingsProblem
from .exceptions import ConfigurationError

SQLITE_OPTIONS = '{"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}'
_WAL = re.compile(r"journal_mode\s*=\s*wal\b", re.IGNORECASE)
_LEVELS: dict[str, Callable[..., checks.CheckMessage]] = {"E": checks.Error, "W": checks.Warning}


def is_sqlite(db_settings: Mapping[str, Any]) -> bool:
    """Whether a DATABASES entry uses a SQLite backend (imports the backend, never connects)."""
    engine = db_settings.get("ENGINE")
    if not isinstance(engine, str) or not engine:
        return False
    try:
        backend = load_backend(engine)
    except ImproperlyConfigured:
        return False  # Django's own checks and the first query report an unusable ENGINE.
    return getattr(backend.DatabaseWrapper, "vendor", "") == "sqlite"


def sqlite_problems(alias: str) -> list[SettingsProblem]:
    """What the SQLite database ``alias`` lacks for weft (nothing when it is not SQLite)."""
    db_settings: Mapping[str, Any] | None = getattr(settings, "DATABASES", {}).get(alias)
    if not db_settings or not is_sqlite(db_settings):
        return []
    options: Mapping[str, Any] = db_settings.get("OPTIONS") or {}
    where = f'DATABASES["{alias}"]["OPTIONS"]'
    found = []
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        found.append(
            SettingsProblem(
                "weft.E025",
                f'The SQLite database "{alias}" must set OPTIONS["transaction_mode"] to "IMMEDIATE": '
                "otherwise a transaction that reads before it writes fails with "
                '"database is locked" instead of waiting for the lock.',
                f"Set {where} = {SQLITE_OPTIONS}.",
            )
        )
    if options.get("timeout") is None:
        found.append(
            SettingsProblem(
                "weft.W001",
                f'The SQLite database "{alias}" sets no busy timeout (OPTIONS["timeout"]), so a write '
                "gives up after sqlite3's default of 5 seconds when another write holds the lock.",
                f'Add "timeout": 20 (seconds) to {where}.',
            )
        )
    if not _WAL.search(str(options.get("init_command", ""))):
        found.append(
            SettingsProblem(
                "weft.W002",
                f'The SQLite database "{alias}" does not enable WAL (OPTIONS["init_command"]), so '
                "readers and the engine's writes block each other.",
                f'Add "init_command": "PRAGMA journal_mode=WAL;" to {where}.',
            )
        )
    found.append(
        SettingsProblem(
            "weft.W003",
            f'The database "{alias}" is SQLite, which has one writer: claim renewal can wait behind '
            "another write, and an atomic=True activity holds the write lock for its whole run.",
            "Run a single engine on SQLite and keep atomic=True activities short; use PostgreSQL for "
            'more than one engine. Silence with SILENCED_SYSTEM_CHECKS = ["weft.W003"].',
        )
    )
    return found


def _check_message(problem: SettingsProblem, obj: str) -> checks.CheckMessage:
    level = _LEVELS[problem.id.removeprefix("weft.")[0]]
    return level(problem.message, hint=problem.hint, obj=obj, id=problem.id)


@checks.register("weft")
def check_weft_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every broken WEFT rule at once, then the SQLite setup of WEFT["DATABASE"]."""
    messages = [_check_message(problem, "settings.WEFT") for problem in conf.problems()]
    try:
        alias = conf.database_alias()
    except ConfigurationError:
        return messages  # already reported above
    messages += [_check_message(p, f'settings.DATABASES["{alias}"]') for p in sqlite_problems(alias)]
    return messages
