"""python manage.py weft replay (this command; also ``manage.py weft_replay``): the deploy check.

Replays stored histories against the code of this process (engine/replayer.py), page by page
inside read-only transactions (store/replay.py): no activity runs, no memo is computed, nothing is
written. Prints each run that would fail and exits 1 if any does. It is its own command because it
loads the engine's driver, which the ``weft`` CLI never imports (``weft replay`` calls it by name).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import database_alias
from ...engine import replayer
from ...history_file import load
from ...store import replay as stored
from ...store.clock import db_clock
from ..replay_options import add_replay_arguments

PAGE = 500


class Command(BaseCommand):
    help = "Replay stored histories against the current code; report each run that would fail (exit 1 if any)."
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        add_replay_arguments(parser)
        parser.add_argument("--json", action="store_true", help="Print JSON for scripts instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        began = time.monotonic()
        outcomes = self._replay_files(options["files"]) if options.get("files") else self._replay_store(options)
        failed = [outcome for outcome in outcomes if not outcome.ok]
        seconds = time.monotonic() - began
        if options.get("json"):
            self.stdout.write(
                json.dumps(
                    {
                        "replayed": len(outcomes),
                        "failed": [
                            {
                                "workflow_id": o.workflow_id,
                                "run_id": o.run_id,
                                "workflow_type": o.workflow_type,
                                "error_type": o.error_type,
                                "message": o.message,
                            }
                            for o in failed
                        ],
                        "seconds": round(seconds, 3),
                    },
                    indent=2,
                )
            )
        else:
            for outcome in failed:
                self.stdout.write(
                    f"FAIL {outcome.workflow_id} ({outcome.workflow_type}, run {outcome.run_id}): "
                    f"{outcome.error_type}: {outcome.message}"
                )
            self.stdout.write(f"Replayed {len(outcomes)} run(s) in {seconds:.2f}s: {len(failed)} would fail.")
        if failed:
            raise CommandError(f"{len(failed)} of {len(outcomes)} replayed run(s) would fail with the current code.")

    def _replay_files(self, files: list[str]) -> list[replayer.ReplayOutcome]:
        from ...exceptions import InvalidArgumentError

        try:
            return [replayer.replay(load(path)) for path in files]
        except InvalidArgumentError as exc:
            raise CommandError(str(exc)) from None

    def _replay_store(self, options: dict[str, Any]) -> list[replayer.ReplayOutcome]:
        using = database_alias()
        moment = options.get("since")
        if isinstance(moment, timedelta):
            moment = db_clock(using) - moment
        remaining: int | None = options.get("max_runs")
        outcomes: list[replayer.ReplayOutcome] = []
        after: str | None = None
        while remaining is None or remaining > 0:
            size = PAGE if remaining is None else min(PAGE, remaining)
            with stored.read_only(using):
                page = stored.page(
                    using,
                    after=after,
                    size=size,
                    workflow_types=options.get("types"),
                    since=moment,
                    open_only=bool(options.get("open_only")),
                )
                outcomes += [replayer.replay(history) for history in page]
            if len(page) < size:
                break
            after = page[-1].workflow_id
            if remaining is not None:
                remaining -= len(page)
        return outcomes
