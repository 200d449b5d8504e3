"""python manage.py weft_engine: run one engine. Thin: parse, validate, run."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from ...exceptions import ConfigurationError, EngineLeaseAcquisitionTimeoutError, OwnershipModeMismatchError

VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _non_negative_float(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = "Run a weft engine: claims runnable workflows and drives them to completion."
    requires_system_checks: list[str] = []  # we validate WEFT ourselves and exit before writing anything
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--engine-id", help="This engine's id (owner_engine on its claims). Default: host:pid:random."
        )
        parser.add_argument(
            "--concurrency", type=_positive_int, help="Activity threads (default ACTIVITY_CONCURRENCY)."
        )
        parser.add_argument("--once", action="store_true", help="Process what is runnable now, then exit.")
        parser.add_argument(
            "--reset-ownership-mode",
            action="store_true",
            help="Forget the ownership mode recorded by earlier engines (stop every engine first), then exit.",
        )
        parser.add_argument(
            "--drain-timeout",
            type=_non_negative_float,
            default=10.0,
            help="Seconds running activities may finish after the first SIGTERM/SIGINT (default 10).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        from ...conf import get_settings

        try:
            settings = get_settings()
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        from ...checks import sqlite_problems

        errors = [p for p in sqlite_problems(settings.database) if p.id.startswith("weft.E")]
        if errors:
            raise CommandError("\n".join(f"{p.id}: {p.message} HINT: {p.hint}" for p in errors))
        self._refuse_unapplied_migrations(settings.database)
        if options["reset_ownership_mode"]:
            from ...engine.ownership import reset_mode_marker

            reset_mode_marker(settings.database)
            self.stdout.write("Ownership mode marker cleared; the next engine to start records its mode.")
            return

        from ...engine.engine import Engine

        try:
            engine = Engine(
                options["engine_id"],
                concurrency=options["concurrency"],
                settings=settings,
                drain_timeout=options["drain_timeout"],
            )
        except ConfigurationError as exc:  # e.g. ACTIVITY_EXECUTOR="celery" without Celery installed
            raise CommandError(str(exc)) from None
        self._install_signal_handlers(engine)
        try:
            engine.run(once=options["once"])
        except (OwnershipModeMismatchError, EngineLeaseAcquisitionTimeoutError) as exc:
            raise CommandError(str(exc)) from None
        if engine.executor.running:
            # Activities still running after the drain are abandoned (their late results are fenced
            # out); Python would otherwise wait for their threads at exit.
            logging.getLogger("weft_django").warning(
                "exiting with %d abandoned activity attempt(s)", len(engine.executor.running)
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _refuse_unapplied_migrations(self, alias: str) -> None:
        connection = connections[alias or DEFAULT_DB_ALIAS]
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            pending = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
            raise CommandError(
                f"The database {alias!r} has unapplied migrations ({pending}{', ...' if len(plan) > 5 else ''}). "
                f"Run `python manage.py migrate` before starting an engine."
            )

    def _install_signal_handlers(self, engine: Any) -> None:
        state = {"signals": 0}

        def handler(signum: int, frame: FrameType | None) -> None:
            state["signals"] += 1
            if state["signals"] == 1:
                logging.getLogger("weft_django").warning(
                    "received %s: draining (send it again to force exit)", signal.Signals(signum).name
                )
                engine.request_stop()
            else:
                sys.stderr.write("weft_engine: forced exit\n")
                os._exit(1)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _configure_logging(self, verbosity: int) -> None:
        log = logging.getLogger("weft_django")
        log.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
        if not log.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
            log.addHandler(handler)
