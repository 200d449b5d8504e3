"""``manage.py weft list`` (without ``--where``) and ``weft describe``: the newest workflows with their
claim, and one workflow's ``describe()`` with its error, stuck error and cancel reason.

A timestamp a row holds but Python cannot represent (a hand edit: before year 1, past year 9999,
``'infinity'``) is read through ``store.moments``: the other rows list normally, the damaged column is
shown "unreadable timestamp (<stored text>)", ``--json`` gives it as null with ``"unreadable"``
mapping it to the stored text, and ``describe`` says what is wrong.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..client import SUMMARY_FIELDS
from .cli_format import claim_expiry, table, unreadable_note, unreadable_text, when

DESCRIBE_KEYS = SUMMARY_FIELDS


def list_command(command: Any, options: dict[str, Any]) -> None:
    """``weft list [--status S] [--type T] [--limit N] [--json]``, newest first."""
    from ..admin.formatting import short_step, status_text
    from ..admin.health import claim_lapsed, current_step, with_ownership
    from ..conf import get_settings
    from ..models import Workflow
    from ..store.clock import db_clock
    from ..store.moments import readable_rows

    using = command._using
    queryset = Workflow.objects.using(using).order_by("-created_at", "id")
    if options["status"]:
        queryset = queryset.filter(status__in=options["status"])
    if options["workflow_type"]:
        queryset = queryset.filter(workflow_type=options["workflow_type"])
    rows = list(readable_rows(with_ownership(queryset, using, timers=True))[: options["limit"]])
    described = [
        {
            **{key: getattr(row, key) for key in DESCRIBE_KEYS if key not in ("epoch", "current_step")},
            "epoch": row.claim_epoch,  # type: ignore[attr-defined]
            "current_step": current_step(row),
            **({"unreadable": damaged} if (damaged := _unreadable(row)) else {}),
        }
        for row in rows
    ]
    if options["json"]:
        command._print_json(
            [{key: item[key] for key in (*DESCRIBE_KEYS, "unreadable") if key in item} for item in described]
        )
        return
    if not described:
        command._print("No workflows match.")
        return
    now, ttl = db_clock(using), get_settings().workflow_claim_ttl
    headers = ("ID", "TYPE", "STATUS", "OWNER", "EPOCH", "CLAIM EXPIRES", "STEP", "CREATED")
    command._print(
        table(
            headers,
            [
                (
                    d["id"],
                    d["workflow_type"],
                    status_text(d["status"]),
                    d["owner_engine"],
                    d["epoch"],
                    _claim_expires(d, row, now, ttl, claim_lapsed) if d["owner_engine"] else None,
                    short_step(d["current_step"]),
                    when(d["created_at"], d.get("unreadable", {}).get("created_at")),
                )
                for d, row in zip(described, rows, strict=True)
            ],
        )
    )
    command._print(f"\n{len(described)} workflow(s) shown (--limit {options['limit']}).")


def _unreadable(row: Any) -> dict[str, str]:
    """The timestamps of a listed row Python cannot represent (a hand edit), the claim's expiry included."""
    found: dict[str, str] = dict(row.weft_unreadable)
    if row.claim_expires_unreadable is not None:
        found["claim_expires_at"] = row.claim_expires_unreadable
    return found


def _claim_expires(described: dict[str, Any], row: Any, now: datetime, ttl: Any, lapsed: Any) -> str | None:
    stored = described.get("unreadable", {}).get("claim_expires_at")
    if stored is not None:
        return unreadable_text(stored)
    return claim_expiry(described["claim_expires_at"], now, lapsed=lapsed(row, now, ttl))


def describe_command(command: Any, options: dict[str, Any]) -> None:
    """``weft describe ID [--json]``: ``describe()``, and in text its error, stuck error, cancel reason
    and, for a row with damaged timestamps, which and what they hold."""
    from ..admin.formatting import error_text, status_text
    from ..client import get_handle
    from ..models import Workflow

    described = get_handle(options["id"]).describe()
    if options["json"]:
        command._print_json(described)
        return
    extra = (
        Workflow.objects.using(command._using).filter(pk=options["id"]).values("error", "stuck_error", "cancel_reason")
    )
    details: dict[str, Any] = dict(extra.first() or {})
    unreadable: dict[str, str] = described.get("unreadable", {})
    lines = [(key, status_text(described[key]) if key == "status" else described[key]) for key in DESCRIBE_KEYS]
    lines = [(key, unreadable_text(unreadable[key]) if key in unreadable else value) for key, value in lines]
    if unreadable:
        lines.append(("damaged", unreadable_note(unreadable)))
    if details.get("error"):
        lines.append(("error", error_text(details["error"])))
    if details.get("stuck_error"):
        lines.append(("stuck on", error_text(details["stuck_error"])))
    if details.get("cancel_reason"):
        lines.append(("cancel reason", details["cancel_reason"]))
    width = max(len(key) for key, _ in lines)
    for key, value in lines:
        shown = when(value) if isinstance(value, datetime) else ("-" if value is None else value)
        command._print(f"{key.ljust(width)}  {shown}")


__all__ = ["DESCRIBE_KEYS", "describe_command", "list_command"]
