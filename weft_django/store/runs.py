"""Runs and steps: creating a run (start, children, schedules), writing steps, run status rows."""

from __future__ import annotations

from typing import Any

from django.db import connections

from ..models import Workflow

# -- client side (start, handles, transitions, schedules, testing) --------------------------

RESULT_FIELDS = ("status", "result", "error", "cancel_reason", "execution_deadline")
_RESULT_SQL = f"SELECT {', '.join(RESULT_FIELDS)} FROM {Workflow._meta.db_table} WHERE id = %s"


def read_end(workflow_id: str, using: str) -> dict[str, Any] | None:
    """The fields ``result()`` reads of run ``workflow_id`` (``RESULT_FIELDS``), or None: no such run."""
    found: dict[str, Any] | None = Workflow.objects.using(using).filter(pk=workflow_id).values(*RESULT_FIELDS).first()
    return found


def read_end_on(reader: Any, workflow_id: str) -> dict[str, Any] | None:
    """As ``read_end``, on ``reader``: a psycopg connection of ``notify.open_reader`` (no Django)."""
    row = reader.execute(_RESULT_SQL, [workflow_id]).fetchone()
    return None if row is None else dict(zip(RESULT_FIELDS, row, strict=True))


def delete_workflows(workflow_ids: list[str], using: str) -> None:
    """Delete these run rows, their other rows already deleted (purge): one statement, where the
    ORM's delete() would load every row to cascade to tables already emptied."""
    placeholders = ", ".join(["%s"] * len(workflow_ids))
    with connections[using].cursor() as cursor:
        cursor.execute(f"DELETE FROM {Workflow._meta.db_table} WHERE id IN ({placeholders})", workflow_ids)


# -- engine side (ownership, the fenced commit, messages, chores) ----------------------------
