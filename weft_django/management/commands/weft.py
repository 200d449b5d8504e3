"""python manage.py weft <subcommand>: inspect and operate workflows from a shell.

Thin: every subcommand parses and validates its input, calls the public API (the client,
``transitions.purge``) or the read-only queries the admin uses (``weft_django.admin.health``,
``.terminal`` and ``.doctor``), and prints an aligned text table, or JSON with ``--json``. Bad input raises
CommandError before anything is written; ``cancel`` and ``purge`` ask first unless ``--yes``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pprint
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError
from django.db.models import Count

from ...exceptions import InvalidArgumentError, WeftError
from ...status import TERMINAL_STATUSES, WorkflowStatus
from .. import listing, visibility_cli
from ..cli_format import claim_expiry, duration_arg, json_default, positive_int_arg, table, when
from ..replay_options import add_replay_arguments, workflow_type

DESCRIBE_KEYS = listing.DESCRIBE_KEYS
TERMINAL = sorted(str(status) for status in TERMINAL_STATUSES)


class Command(BaseCommand):
    help = "Inspect and operate weft workflows: list, describe, start, signal, cancel, purge, doctor, ..."
    requires_system_checks: list[str] = []  # doctor reports broken settings itself
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        def command(name: str, help: str) -> argparse.ArgumentParser:
            p = sub.add_parser(name, help=help, description=help)
            p.add_argument("--json", action="store_true", help="Print JSON for scripts instead of text.")
            return p

        p = command("list", "List workflows, newest first.")
        p.add_argument("--status", action="append", choices=WorkflowStatus.values, help="Repeat for several.")
        p.add_argument("--type", dest="workflow_type", type=workflow_type, help="Only this workflow type.")
        p.add_argument("--limit", type=positive_int_arg, default=50, help="At most this many rows (default 50).")
        visibility_cli.add_where(p)
        p.add_argument("--cursor", help="The next page of a --where listing (printed under it).")

        p = command("describe", "Show one workflow (the keys of WorkflowHandle.describe()).")
        p.add_argument("id")

        p = command("start", "Start a workflow by its registered name.")
        p.add_argument("type", help="The workflow's registered name.")
        # dest names other than args/kwargs: call_command passes an "args" option as positional arguments.
        p.add_argument(
            "--args", dest="args_json", default="[]", help='Positional arguments, a JSON list (default "[]").'
        )
        p.add_argument(
            "--kwargs", dest="kwargs_json", default="{}", help='Keyword arguments, a JSON object (default "{}").'
        )
        p.add_argument("--id", dest="workflow_id", help="The workflow id (default: a new UUID).")
        p.add_argument("--queue", help='Start it in this queue of WEFT["QUEUES"] (default: the workflow\'s own).')
        p.add_argument("--priority", type=int, help="Its priority in the queue (lower first; default 0).")
        p.add_argument("--concurrency-key", help="At most one run of the queue with this key at a time.")

        p = command("signal", "Send a signal to a workflow.")
        p.add_argument("id")
        p.add_argument("name")
        p.add_argument("--payload", help="JSON payload (default null).")
        p.add_argument("--signal-id", help="Deduplication id: resending it to the same run is a no-op.")

        p = command("query", "Ask a running workflow a query.")
        p.add_argument("id")
        p.add_argument("name")
        p.add_argument("--arg", help="JSON argument passed to the query handler (omitted: no argument).")
        p.add_argument("--timeout", type=duration_arg, default=timedelta(seconds=5), help="Default 5s.")

        p = command("update", "Send an update to a workflow and print the handler's result.")
        p.add_argument("id")
        p.add_argument("name")
        p.add_argument("--payload", help="JSON payload (default null).")
        p.add_argument("--idempotency-key", help="Resending the same key returns the first outcome.")
        p.add_argument("--timeout", type=duration_arg, default=timedelta(seconds=5), help="Default 5s.")

        p = command("cancel", "Cancel a workflow (asks first unless --yes).")
        p.add_argument("id")
        p.add_argument("--reason", help="Stored with the run as its cancel reason.")
        p.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

        for name, help in (
            ("suspend", "Suspend a running workflow: no engine drives it until it is resumed."),
            ("resume", "Resume a suspended workflow."),
            ("retry", "Retry a failed workflow from its last checkpoint (same run id)."),
        ):
            command(name, help).add_argument("id")

        p = command("purge", "Delete terminal workflows (default: those WEFT['RETENTION'] says are due).")
        p.add_argument("--status", action="append", choices=TERMINAL, help="Only this terminal status; repeatable.")
        p.add_argument(
            "--older-than", type=duration_arg, help='Finished longer ago than this ("7d", "12h"), instead of RETENTION.'
        )
        p.add_argument("--dry-run", action="store_true", help="Only say how many would be purged.")
        p.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

        command("engines", "List engines: alive, dead or stopped, and the claims each holds.")

        p = command("claims", "List claims held by engines, soonest expiry first.")
        p.add_argument("--all", action="store_true", help="Include released claims (no holder).")
        p.add_argument("--limit", type=positive_int_arg, default=200, help="At most this many rows (default 200).")

        command("schedules", "List schedules.")

        command(
            "queues",
            "List queues (waiting, running, rate window, keys in use, serving engines) and limited activities.",
        )

        p = command("doctor", "Check the database, migrations, settings, claims, timers and engines.")
        p.add_argument("--strict", action="store_true", help="Exit non-zero on warnings too.")
        visibility_cli.add_subcommands(command)  # fork, bulk (issue 19)

        p = command("replay", "Replay stored histories against the current code; exit 1 if a run would fail.")
        add_replay_arguments(p)
        p = command("export", "Write a workflow's current run and its history as JSON (weft-history/1).")
        p.add_argument("id")
        p.add_argument("--output", help="Write to this file instead of stdout.")

    # ------------------------------------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        handler: Callable[[dict[str, Any]], None] = getattr(self, f"_{options['subcommand']}")
        try:
            handler(options)
        except NotImplementedError as exc:
            raise CommandError(
                f"{options['subcommand']} is not available in this version of weft_django: {exc}"
            ) from None
        except (WeftError, InvalidArgumentError) as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from None
        except OperationalError as exc:
            from ..cli_format import unreachable_database

            unreachable = unreachable_database(self._using)
            if unreachable is None:  # the database answers: another error (a lock timeout, ...), shown whole
                raise
            raise unreachable from exc

    @property
    def _using(self) -> str:
        from ...conf import database_alias

        return database_alias()

    def _print(self, text: str) -> None:
        self.stdout.write(text)

    def _print_json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, default=json_default, ensure_ascii=False))

    def _payload(self, text: str | None, what: str) -> Any:
        from ...admin.payloads import PayloadInputError, parse_payload

        try:
            return parse_payload(text, what)
        except PayloadInputError as exc:
            raise CommandError(str(exc)) from None

    def _confirm(self, question: str, options: dict[str, Any]) -> None:
        if options.get("yes"):
            return
        if not sys.stdin.isatty():
            raise CommandError(
                f"{question} Refusing to go on without confirmation: pass --yes (stdin is not a terminal)."
            )
        answer = input(f"{question} [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise CommandError("Aborted: nothing was changed.")

    # -- deploys: the replay check (its own command: it loads the engine's driver) and export ------
    def _replay(self, options: dict[str, Any]) -> None:
        from django.core.management import call_command

        keys = ("types", "since", "max_runs", "open_only", "files", "json")
        call_command("weft_replay", stdout=self.stdout, **{key: options.get(key) for key in keys})

    def _export(self, options: dict[str, Any]) -> None:
        from ...history_file import to_json
        from ...store.replay import one, read_only
        from ...validation import validate_workflow_id

        validate_workflow_id(options["id"])  # the database cannot compare a NUL or a lone surrogate
        with read_only(self._using):
            history = one(options["id"], self._using)
        if history is None:
            raise CommandError(f"No workflow {options['id']!r}: nothing was exported.")
        if history.unreadable:  # a hand edit: exported, its history would replay as another run
            held = "; ".join(f"{name}: {text}" for name, text in history.unreadable.items())
            raise CommandError(
                f"Workflow {options['id']!r} cannot be exported: {held} (a value Python cannot represent, "
                "written by hand or by a bad migration). Repair the row first; nothing was exported."
            )
        text = json.dumps(to_json(history), indent=2, ensure_ascii=False)
        if options.get("output"):
            try:
                with open(options["output"], "w", encoding="utf-8") as out:
                    out.write(text + "\n")
            except OSError as exc:  # a missing directory, no permission, a directory, a full disk
                raise CommandError(f"--output {options['output']!r}: cannot write the history: {exc}.") from None
            self._print(f"Wrote the history of {options['id']!r} ({len(history.steps)} steps) to {options['output']}.")
        else:
            self._print(text)

    # -- reading ---------------------------------------------------------------------------------
    def _list(self, options: dict[str, Any]) -> None:
        if options.get("where") or options.get("cursor"):
            visibility_cli.list_where(self, options, table, when)
            return
        listing.list_command(self, options)

    def _describe(self, options: dict[str, Any]) -> None:
        listing.describe_command(self, options)

    def _engines(self, options: dict[str, Any]) -> None:
        from ...admin.formatting import heartbeat_age
        from ...admin.health import engine_rows
        from ...conf import get_settings
        from ...store.clock import db_clock

        rows = engine_rows(self._using, db_clock(self._using), get_settings().workflow_claim_ttl)
        if options["json"]:
            self._print_json([row.as_dict() for row in rows])
            return
        if not rows:
            self._print("No engine has registered yet.")
            return
        headers = ("ENGINE", "STATE", "HOST", "PID", "MODE", "STARTED", "HEARTBEAT", "CLAIMS", "LAPSED")
        self._print(
            table(
                headers,
                [
                    (
                        r.engine.id,
                        r.state,
                        r.engine.host,
                        r.engine.pid,
                        r.engine.mode,
                        when(r.engine.started_at, r.unreadable.get("started_at")),  # a hand edit: marked
                        when(None, r.unreadable["heartbeat_at"])
                        if r.heartbeat_age is None
                        else heartbeat_age(r.heartbeat_age),
                        r.claims_held,
                        r.claims_lapsed,
                    )
                    for r in rows
                ],
            )
        )

    def _queues(self, options: dict[str, Any]) -> None:
        from ...admin.queues import queue_report
        from ...conf import get_settings

        settings = get_settings()
        report = queue_report(settings, self._using, settings.workflow_claim_ttl)
        if options["json"]:
            self._print_json(report)
            return
        if not report["queues"] and not report["activities"]:
            self._print('No queue is defined (WEFT["QUEUES"]) and no limited activity has run.')
            return
        headers = ("QUEUE", "WAITING", "RUNNING", "CONCURRENCY", "PER_ENGINE", "RATE", "IN_WINDOW", "KEYS", "SERVED_BY")
        rows = [
            (
                r["queue"] + ("" if r["configured"] else " (not configured)"),
                r["waiting"],
                r["running"],
                "-" if r["concurrency"] is None else r["concurrency"],
                "-" if r["per_engine"] is None else r["per_engine"],
                r["rate"] or "-",
                "-" if r["in_window"] is None else r["in_window"],
                ", ".join(f"{key}" for key, _ in r["keys"]) or "-",
                ", ".join(r["served_by"]) or "NO LIVE ENGINE",
            )
            for r in report["queues"]
        ]
        if rows:
            self._print(table(headers, rows))
        if report["activities"]:
            activity_rows = [(a["activity"], a["running"], ", ".join(a["keys"]) or "-") for a in report["activities"]]
            self._print(table(("ACTIVITY", "HOLDING_SLOTS", "KEYS"), activity_rows))

    def _claims(self, options: dict[str, Any]) -> None:
        from ...admin.health import claim_rows
        from ...conf import get_settings
        from ...store.clock import db_clock

        now = db_clock(self._using)
        ttl = get_settings().workflow_claim_ttl
        rows = claim_rows(self._using, now, ttl, held_only=not options["all"], limit=options["limit"])
        if options["json"]:
            self._print_json([row.as_dict() for row in rows])
            return
        if not rows:
            self._print("No engine holds a claim." if not options["all"] else "No claims.")
            return
        headers = ("WORKFLOW", "TYPE", "STATUS", "ENGINE", "EPOCH", "EXPIRES")
        self._print(
            table(
                headers,
                [
                    (
                        r.workflow_id,
                        r.workflow_type,
                        r.status,
                        r.engine_id,
                        r.epoch,
                        when(None, r.unreadable["expires_at"])  # a hand edit: marked
                        if "expires_at" in r.unreadable
                        else claim_expiry(r.expires_at, now, lapsed=r.lapsed),
                    )
                    for r in rows
                ],
            )
        )

    def _schedules(self, options: dict[str, Any]) -> None:
        if importlib.util.find_spec("weft_django.schedules") is None:
            self._print("no schedules module yet")
            return
        from ... import schedules
        from ...models import Schedule
        from ...store.moments import readable_rows

        # a time a hand edit put out of Python's reach reads as None, shown marked (store/moments.py)
        rows = list(readable_rows(Schedule.objects.using(self._using).order_by("id")))
        if options["json"]:
            self._print_json([_described_schedule(schedules, row.id) for row in rows])
            return
        if not rows:
            self._print("No schedules.")
            return
        headers = ("SCHEDULE", "TYPE", "WHEN", "TZ", "OVERLAP", "PAUSED", "NEXT FIRE", "LAST FIRED", "MISSED")
        self._print(
            table(
                headers,
                [
                    (
                        r.id,
                        r.workflow_type,
                        r.cron or (f"every {r.every}s" if r.every else None),
                        r.timezone,
                        r.overlap,
                        "paused" if r.paused else "",
                        when(r.next_fire_at, r.weft_unreadable.get("next_fire_at")),  # type: ignore[attr-defined]
                        when(r.last_fired_at, r.weft_unreadable.get("last_fired_at")),  # type: ignore[attr-defined]
                        r.missed_fire_count,
                    )
                    for r in rows
                ],
            )
        )

    def _doctor(self, options: dict[str, Any]) -> None:
        from ...admin.doctor import ERROR, WARNING, doctor, healthy

        findings = doctor(self._using)
        ok = healthy(findings, strict=options["strict"])
        errors = sum(1 for f in findings if f.level == ERROR)
        warnings = sum(1 for f in findings if f.level == WARNING)
        if options["json"]:
            self._print_json({"healthy": ok, "checks": [f.as_dict() for f in findings]})
        else:
            width = max(len(f.check) for f in findings)
            for finding in findings:
                self._print(f"{finding.level.upper():8} {finding.check.ljust(width)}  {finding.summary}")
                for detail in finding.details:
                    self._print(f"{'':8} {'':{width}}    - {detail}")
                if finding.hint and finding.level in (ERROR, WARNING):
                    self._print(f"{'':8} {'':{width}}    hint: {finding.hint}")
            verdict = "healthy" if ok else "UNHEALTHY"
            self._print(f"\n{verdict}: {errors} error(s), {warnings} warning(s).")
        if not ok:
            raise CommandError(f"weft doctor: unhealthy ({errors} error(s), {warnings} warning(s)).", returncode=1)

    # -- acting ----------------------------------------------------------------------------------
    def _start(self, options: dict[str, Any]) -> None:
        from ...client import start
        from ...registry import resolve_workflow

        args = self._payload(options["args_json"], "--args")
        kwargs = self._payload(options["kwargs_json"], "--kwargs")
        if not isinstance(args, list):
            raise CommandError(f"--args must be a JSON list of positional arguments (got {options['args_json']!r}).")
        if not isinstance(kwargs, dict):
            raise CommandError(f"--kwargs must be a JSON object of keyword arguments (got {options['kwargs_json']!r}).")
        resolve_workflow(options["type"])  # WorkflowNotRegisteredError names the registered types
        handle = start(
            options["type"],
            args=args,
            kwargs=kwargs,
            id=options["workflow_id"],
            queue=options.get("queue"),
            priority=options.get("priority"),
            concurrency_key=options.get("concurrency_key"),
        )
        if options["json"]:
            self._print_json(handle.describe())
        else:
            self._print(f'Started {options["type"]} as "{handle.id}" ({handle.status}).')

    def _signal(self, options: dict[str, Any]) -> None:
        from ...client import signal

        payload = self._payload(options["payload"], "--payload")
        signal(options["id"], options["name"], payload, signal_id=options["signal_id"])
        if options["json"]:
            self._print_json({"id": options["id"], "signal": options["name"], "sent": True})
        else:
            self._print(f'Signal "{options["name"]}" sent to "{options["id"]}".')

    def _query(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        handle = get_handle(options["id"])
        if options["arg"] is None:
            result = handle.query(options["name"], timeout=options["timeout"])
        else:
            result = handle.query(options["name"], self._payload(options["arg"], "--arg"), timeout=options["timeout"])
        self._show_result(result, options)

    def _update(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        payload = self._payload(options["payload"], "--payload")
        result = get_handle(options["id"]).update(
            options["name"], payload, idempotency_key=options["idempotency_key"], timeout=options["timeout"]
        )
        self._show_result(result, options)

    def _show_result(self, result: Any, options: dict[str, Any]) -> None:
        if options["json"]:
            self._print_json(result)
        else:
            self._print(pprint.pformat(result, width=100, sort_dicts=False))

    def _cancel(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        handle = get_handle(options["id"])
        described = handle.describe()  # WorkflowNotFoundError before asking
        if described["status"] in TERMINAL_STATUSES:
            raise CommandError(
                f'Workflow "{handle.id}" already ended ({described["status"]}); there is nothing to cancel.'
            )
        self._confirm(f'Cancel workflow "{handle.id}" ({described["workflow_type"]}, {described["status"]})?', options)
        handle.cancel(options["reason"])
        self._done(options, handle.id, "cancelled")

    def _fork(self, options: dict[str, Any]) -> None:
        visibility_cli.fork_command(self, options)

    def _bulk(self, options: dict[str, Any]) -> None:
        visibility_cli.bulk_command(self, options)

    def _suspend(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        get_handle(options["id"]).suspend()
        self._done(options, options["id"], "suspended")

    def _resume(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        get_handle(options["id"]).resume()
        self._done(options, options["id"], "resumed")

    def _retry(self, options: dict[str, Any]) -> None:
        from ...client import get_handle

        get_handle(options["id"]).retry()
        self._done(options, options["id"], "retried")

    def _done(self, options: dict[str, Any], workflow_id: str, what: str) -> None:
        if options["json"]:
            from ...client import get_handle

            self._print_json(get_handle(workflow_id).describe())
        else:
            self._print(f'Workflow "{workflow_id}" {what}.')

    def _purge(self, options: dict[str, Any]) -> None:
        from ...admin.formatting import format_duration
        from ...admin.terminal import retention_due
        from ...conf import get_settings
        from ...models import Workflow
        from ...store.clock import db_now
        from ...store.maintenance import kept_whatever_their_age
        from ...transitions import purge

        statuses = options["status"] or TERMINAL
        now = db_now(self._using)
        if options["older_than"] is not None:
            queryset = kept_whatever_their_age(
                Workflow.objects.using(self._using).filter(
                    status__in=statuses, finished_at__lt=now - options["older_than"]
                ),
                now,
                self._using,
            )
            rule = f"finished more than {format_duration(options['older_than'])} ago"
        else:
            queryset = retention_due(self._using, now, get_settings().retention, statuses)
            rule = "due under WEFT['RETENTION']"
        counts = dict(queryset.values("status").annotate(n=Count("pk")).order_by().values_list("status", "n"))
        total = sum(counts.values())
        breakdown = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
        if options["dry_run"] or not total:
            if options["json"]:
                self._print_json({"purged": 0, "would_purge": total, "by_status": counts})
            else:
                self._print(f"{total} workflow(s) {rule}" + (f" ({breakdown})" if total else "") + "; none purged.")
            return
        self._confirm(f"Purge {total} terminal workflow(s) {rule} ({breakdown})? This cannot be undone.", options)
        purged = purge(queryset, using=self._using)
        if options["json"]:
            self._print_json({"purged": purged, "by_status": counts})
        else:
            self._print(f"Purged {purged} workflow(s).")


def _described_schedule(schedules: Any, schedule_id: str) -> dict[str, Any]:
    """A schedule's describe(); for a stored row that cannot be used, its id and the error instead."""
    try:
        described: dict[str, Any] = schedules.get_schedule(schedule_id).describe()
    except schedules.UnusableScheduleError as exc:
        return {"id": schedule_id, "error": {"type": type(exc).__name__, "column": exc.column, "message": str(exc)}}
    return described
