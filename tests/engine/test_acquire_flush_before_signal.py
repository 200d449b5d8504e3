"""ADR 0015: the acquire-and-load commits without waiting for its WAL flush. That is safe only while
nothing is acknowledged before a flushed commit covers it; the ``claim_acquired`` Django signal is such
an acknowledgement (docs/operations.md: signals are sent once the transaction that made the event
durable has committed). A receiver that records "engine E holds W at epoch N" must not hear of a claim
that a crash of PostgreSQL can still take back (and whose epoch the sequence may hand out again).

The check reads the WAL itself (pg_walinspect, PostgreSQL 15+): where the acquire's commit record ends,
against how far the WAL was flushed when the receiver ran."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from weft_django import signals
from weft_django.engine.engine import Engine
from weft_django.models import WorkflowClaim

from .ticking import tick_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@weft.workflow(name="tests.acquire_flush.parks")
def parks(ctx: Any) -> Any:
    value = yield ctx.wait_for_signal("go")
    return value


def _walinspect() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'")
        if cursor.fetchone() is None:
            return False
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    return True


def _commit_end(xid: str, since: str) -> str | None:
    """Where the commit record of transaction ``xid`` ends in the WAL written since ``since``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT end_lsn::text FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn()) "
            "WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%%' AND xid::text = %s",
            [since, xid],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def _flushed_past(flushed: str, end: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::pg_lsn >= %s::pg_lsn", [flushed, end])
        return bool(cursor.fetchone()[0])


def test_claim_acquired_is_sent_only_once_the_acquire_is_flushed():
    if not _walinspect():
        pytest.skip("needs PostgreSQL's pg_walinspect")
    heard: list[tuple[str, str, str]] = []  # (workflow id, the claim's xmin, the WAL flushed at the signal)

    def receiver(sender: Any, workflow_id: str, **kwargs: Any) -> None:
        with connection.cursor() as cursor:  # the engine loop's own connection, in autocommit
            cursor.execute(
                "SELECT pg_current_wal_flush_lsn()::text, "
                "(SELECT xmin::text FROM weft_django_workflowclaim WHERE workflow_id = %s)",
                [workflow_id],
            )
            flushed, xmin = cursor.fetchone()
        heard.append((workflow_id, xmin, flushed))

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        since = cursor.fetchone()[0]
    signals.claim_acquired.connect(receiver, weak=False)
    engine = Engine("flush-engine")
    engine.start()
    try:
        for n in range(5):  # one acquire per round (a flush by the WAL writer may come first once)
            wid = f"parks-{n}"
            weft.start("tests.acquire_flush.parks", id=wid)
            tick_until(
                engine,
                lambda wid=wid: WorkflowClaim.objects.filter(pk=wid, engine_id="flush-engine").exists(),
                f"{wid} claimed",
            )
    finally:
        signals.claim_acquired.disconnect(receiver)
        engine.shutdown()
    assert sorted(wid for wid, _, _ in heard) == [f"parks-{n}" for n in range(5)]
    unflushed = []
    for wid, xmin, flushed in heard:
        end = _commit_end(xmin, since)
        assert end is not None, f"no commit record of the acquire of {wid} (xid {xmin})"
        if not _flushed_past(flushed, end):
            unflushed.append((wid, flushed, end))
    # (workflow, WAL flushed to when the receiver ran, where the acquire's commit record ends)
    assert unflushed == [], "claim_acquired was sent before the acquire's commit was flushed"
