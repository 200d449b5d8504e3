"""The visibility parts of ``manage.py weft`` (issue 19): ``list --where``, ``fork`` and ``bulk``.

``--where KEY=VALUE`` is repeatable; every one must hold. KEY is a filter of ``weft.list_workflows``
(``status``, ``workflow_type``, ``parent_id``, ``schedule_id``, ``id_prefix``, ``created_after``,
``created_before``, ``started_after``, ``started_before``, ``ended_after``, ``ended_before``) or a
search attribute with an optional operator (``customer=acme``, ``amount__gte=10``,
``tags__in=["a","b"]``). VALUE is JSON when it parses as JSON, else text; an ISO 8601 time with a
zone is a datetime.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from ..bulk import APPLIES_TO, bulk_cancel, bulk_count, bulk_purge, bulk_retry
from ..forking import fork
from ..visibility import list_workflows, parse_where
from .cli_format import unreadable_text


def add_where(parser: argparse.ArgumentParser) -> None:
    """The ``--where`` option (repeatable)."""
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='A filter: "status=failed", "customer=acme", "amount__gte=10", "started_after=2026-01-01T00:00Z". '
        "Repeat for several (all must hold).",
    )


def add_subcommands(command: Any) -> None:
    """Add ``fork`` and ``bulk`` through the weft command's ``command(name, help)`` factory."""
    p = command("fork", "Start a new run that reuses the first N recorded steps of a workflow.")
    p.add_argument("id")
    p.add_argument("--from-step", type=int, required=True, help="How many recorded steps to reuse (0: none).")
    p.add_argument("--new-id", help="The new workflow id (default: a new UUID).")
    p = command("bulk", "Cancel, retry or purge every workflow a filter selects (asks first unless --yes).")
    p.add_argument("operation", choices=sorted(APPLIES_TO))
    add_where(p)
    p.add_argument("--reason", help="cancel: the cancel reason stored with each run.")
    p.add_argument("--expected-count", type=int, help="The confirmed count (instead of asking): refused if stale.")
    p.add_argument("--batch-size", type=int, default=100, help="Workflows per batch (default 100).")
    p.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")


def list_where(command: Any, options: dict[str, Any], table: Callable[..., str], when: Callable[..., str]) -> None:
    """``weft list --where ...`` (and ``--cursor``): one page through ``weft.list_workflows``, shown
    with the command's ``table`` and ``when`` formatters."""
    page = list_workflows(limit=min(options["limit"], 1000), cursor=options.get("cursor"), **_with_flags(options))
    if options["json"]:
        # "unreadable" only for a row with a timestamp Python cannot represent, as in `weft list --json`
        shown = [{k: v for k, v in vars(summary).items() if k != "unreadable" or v} for summary in page]
        command._print_json({"workflows": shown, "next_cursor": page.next_cursor})
        return
    if not page.workflows:
        command._print("No workflows match.")
        return
    rows = [
        (
            s.id,
            s.workflow_type,
            s.status,
            when(s.created_at, s.unreadable.get("created_at")),
            json.dumps(_attributes_shown(s.attributes, s.unreadable), default=str)[:80],
        )
        for s in page
    ]
    command._print(table(("ID", "TYPE", "STATUS", "CREATED", "ATTRIBUTES"), rows))
    more = f" Next page: --cursor {page.next_cursor}" if page.next_cursor else ""
    command._print(f"\n{len(page)} workflow(s) shown.{more}")


def _attributes_shown(attributes: dict[str, Any], unreadable: dict[str, str]) -> dict[str, Any]:
    """A run's attributes as the table shows them: a time Python cannot represent (a hand edit, named
    ``"attributes.<name>"`` in ``unreadable``) as "unreadable timestamp (<stored text>)"."""
    prefix = "attributes."
    damaged = {key[len(prefix) :]: unreadable_text(text) for key, text in unreadable.items() if key.startswith(prefix)}
    return {**attributes, **damaged}


def _with_flags(options: dict[str, Any]) -> dict[str, Any]:
    found = parse_where(options.get("where") or [])
    if options.get("status"):
        found.setdefault("status", options["status"])
    if options.get("workflow_type"):
        found.setdefault("workflow_type", options["workflow_type"])
    return found


def fork_command(command: Any, options: dict[str, Any]) -> None:
    """``weft fork ID --from-step N [--new-id X]``."""
    handle = fork(options["id"], from_step=options["from_step"], new_id=options["new_id"])
    if options["json"]:
        command._print_json({"id": handle.id, "forked_from": options["id"], "from_step": options["from_step"]})
    else:
        command._print(f'Forked "{options["id"]}" at step {options["from_step"]}: new workflow "{handle.id}".')


def bulk_command(command: Any, options: dict[str, Any]) -> None:
    """``weft bulk cancel|retry|purge --where ...``: count, confirm (or --expected-count), then apply."""
    operation = options["operation"]
    if options["reason"] is not None and operation != "cancel":
        raise CommandError(f"--reason applies to bulk cancel only, not {operation}; nothing was changed.")
    chosen = parse_where(options["where"])
    expected = options["expected_count"]
    if expected is None:
        expected = bulk_count(operation, **chosen)
        if not expected:
            command._print(f"No workflows to {operation} match; nothing was changed.")
            return
        command._confirm(f"{operation.capitalize()} {expected} workflow(s)?", options)
    extra = {"reason": options["reason"]} if operation == "cancel" else {}
    run = {"cancel": bulk_cancel, "retry": bulk_retry, "purge": bulk_purge}[operation]
    result = run(expected_count=expected, batch_size=options["batch_size"], **extra, **chosen)
    if options["json"]:
        command._print_json(vars(result))
    else:
        skipped = f", {len(result.skipped)} skipped (changed meanwhile)" if result.skipped else ""
        refused = f", {len(result.errors)} refused" if result.errors else ""
        command._print(f"{operation}: {result.changed} of {result.matched} workflow(s){skipped}{refused}.")
        for workflow_id, message in result.errors.items():
            command._print(f"  {workflow_id}: {message}")


__all__ = ["add_subcommands", "add_where", "bulk_command", "fork_command", "list_where"]
