"""The write audit (tests/chaos/audit.py) finds what it claims to find: writes made the way the engine
makes them (the claim row locked, the holder and epoch current) pass, and each seeded bad write is
reported by its check. "Engines" here are plain sessions named ``weft-<id>``, as the chaos engines'
are; the test process is the client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connections
from django.utils import timezone

from tests.chaos import audit
from tests.chaos.audit import AckedMessage
from weft_django.codec import encode
from weft_django.models import BufferedSignal, Engine, Workflow, WorkflowClaim

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.chaos]

SEQUENTIAL = {"tests.chaos_approve"}


@pytest.fixture
def audited() -> Iterator[None]:
    audit.install()
    try:
        yield
    finally:
        audit.uninstall()


@contextmanager
def engine(engine_id: str) -> Iterator[psycopg.Connection[Any]]:
    """A session that says it is engine ``engine_id`` (as PGAPPNAME makes the chaos engines' sessions)."""
    settings = connections["default"].settings_dict
    with psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        dbname=settings["NAME"],
        application_name=f"weft-{engine_id}",
    ) as conn:
        yield conn


def start(wid: str) -> Workflow:
    """A client's start: the workflow row and its unheld claim."""
    now = timezone.now()
    row = Workflow.objects.create(
        id=wid,
        workflow_type="tests.chaos_approve",
        status="running",
        input=encode({"args": [], "kwargs": {}}),
        created_at=now,
        updated_at=now,
    )
    WorkflowClaim.objects.create(workflow_id=wid, epoch=0, run_created_at=now)
    return row


def acquire(conn: psycopg.Connection[Any], wid: str, epoch: int, engine_id: str, ttl_s: float = 30) -> None:
    with conn.transaction():
        conn.execute(
            "UPDATE weft_django_workflowclaim SET epoch = %s, engine_id = %s, claimed_at = clock_timestamp(),"
            " expires_at = clock_timestamp() + %s * interval '1 second' WHERE workflow_id = %s",
            [epoch, engine_id, ttl_s, wid],
        )


def lock(conn: psycopg.Connection[Any], wid: str) -> None:
    conn.execute("SELECT epoch FROM weft_django_workflowclaim WHERE workflow_id = %s FOR NO KEY UPDATE", [wid])


def write_step(
    conn: psycopg.Connection[Any],
    row: Workflow,
    seq: int,
    epoch: int,
    status: str = "completed",
    kind: str = "activity",
) -> None:
    conn.execute(
        "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, result, attempts, epoch,"
        " started_at, completed_at) VALUES (%s, %s, %s, %s, 'chaos_flip', %s, %s, 1, %s, now(), now())"
        " ON CONFLICT (run_id, seq) DO UPDATE SET status = EXCLUDED.status, result = EXCLUDED.result,"
        " epoch = EXCLUDED.epoch",
        [row.id, row.run_id, seq, kind, status, encode(seq), epoch],
    )


def found() -> dict[str, list[str]]:
    violations, _ = audit.check_audit([], SEQUENTIAL)
    return {name: found for name, found in violations.items() if found}


def test_a_fenced_history_passes(audited: None) -> None:
    row = start("w")
    with engine("e1") as e1:
        acquire(e1, "w", 5, "e1")
        with e1.transaction():
            lock(e1, "w")
            write_step(e1, row, 0, 5, status="running")
        with e1.transaction():
            lock(e1, "w")
            write_step(e1, row, 0, 5)
            write_step(e1, row, 1, 5)
        with e1.transaction():  # the terminal commit: end the run and release the claim, one transaction
            lock(e1, "w")
            e1.execute("UPDATE weft_django_workflow SET status = 'completed', result = '1' WHERE id = 'w'")
            e1.execute(
                "UPDATE weft_django_workflowclaim SET engine_id = NULL, expires_at = NULL WHERE workflow_id = %s", ["w"]
            )
    assert found() == {}
    _, figures = audit.check_audit([], SEQUENTIAL)
    assert figures["by_kind"]["engine claim acquire"] == 1 and figures["by_kind"]["engine claim release"] == 1


def test_a_write_without_the_claim_lock_or_at_a_stale_epoch_or_by_a_non_holder(audited: None) -> None:
    row = start("w")
    with engine("e1") as e1, engine("e2") as e2:
        acquire(e1, "w", 5, "e1")
        with e1.transaction():  # no lock taken
            write_step(e1, row, 0, 5, status="running")
        with e1.transaction():  # locked, but the step carries an older epoch
            lock(e1, "w")
            write_step(e1, row, 0, 4)
        with e2.transaction():  # e2 locks the row, but e1 holds the claim
            lock(e2, "w")
            e2.execute("UPDATE weft_django_workflow SET current_step = 'x' WHERE id = 'w'")
    fence = found()["A1 fenced writes (no stale epoch, no non-holder)"]
    assert len(fence) == 3, fence
    assert "did not hold the claim row" in fence[0]
    assert "written at epoch 4 while the claim's epoch was 5" in fence[1]
    assert "the claim's holder was 'e1'" in fence[2]


def test_a_takeover_of_a_live_claim_and_a_renewal_by_a_non_holder(audited: None) -> None:
    start("w")
    with engine("e1") as e1, engine("e2") as e2:
        acquire(e1, "w", 5, "e1")
        acquire(e2, "w", 6, "e2")  # e1's claim had 30 s left
        with e1.transaction():
            e1.execute(
                "UPDATE weft_django_workflowclaim SET expires_at = expires_at + interval '1 second'"
                " WHERE workflow_id = 'w'"
            )
    fence = found()["A1 fenced writes (no stale epoch, no non-holder)"]
    assert any("took over a live claim" in v for v in fence), fence
    assert any("changed a claim held by 'e2'" in v for v in fence), fence


def test_a_takeover_before_the_claims_expiry_passes_only_once_its_holders_heartbeat_lapsed(audited: None) -> None:
    """A dormant claim (ADR 0014) is taken over when its holder's heartbeat is older than the TTL and
    the grace, before its own expiry: A1 accepts that takeover, and only that one."""
    for wid in ("lapsed", "alive"):
        start(wid)
    now = timezone.now()
    for engine_id, beat in (("e-lapsed", now - timedelta(seconds=60)), ("e-alive", now)):
        Engine.objects.create(id=engine_id, host="h", pid=1, mode="automatic", started_at=beat, heartbeat_at=beat)
    with engine("e-lapsed") as old, engine("e-alive") as alive, engine("e2") as e2:
        acquire(old, "lapsed", 5, "e-lapsed", ttl_s=300)
        acquire(alive, "alive", 6, "e-alive", ttl_s=300)
        acquire(e2, "lapsed", 7, "e2")
        acquire(e2, "alive", 8, "e2")
    violations, _ = audit.check_audit([], SEQUENTIAL, lapse=timedelta(seconds=30))
    fence = violations["A1 fenced writes (no stale epoch, no non-holder)"]
    assert len(fence) == 1 and "took over a live claim" in fence[0] and "(workflow alive)" in fence[0], fence


def test_a_duplicate_step_a_rewritten_outcome_and_a_run_ended_twice(audited: None) -> None:
    row = start("w")
    with engine("e1") as e1:
        acquire(e1, "w", 5, "e1")
        with e1.transaction():
            lock(e1, "w")
            write_step(e1, row, 0, 5)
        with e1.transaction():
            lock(e1, "w")
            e1.execute("UPDATE weft_django_step SET result = '99' WHERE run_id = %s AND seq = 0", [row.run_id])
            e1.execute("DELETE FROM weft_django_step WHERE run_id = %s AND seq = 0", [row.run_id])
            write_step(e1, row, 0, 5)
        for status in ("completed", "running", "completed"):  # ended, reopened, ended again
            with e1.transaction():
                lock(e1, "w")
                e1.execute("UPDATE weft_django_workflow SET status = %s WHERE id = 'w'", [status])
    got = found()
    assert len(got["A2 no duplicate steps"]) == 2, got  # the rewrite, the second insert
    assert any("the run ended again" in v for v in got["A3 no run ended twice"]), got
    assert any("changed after its run ended" in v for v in got["A3 no run ended twice"]), got


def test_a_double_consumption_and_a_double_settlement(audited: None) -> None:
    row = start("w")
    now = timezone.now()
    signal = BufferedSignal.objects.create(
        workflow=row, run_id=row.run_id, name="poke", signal_id="s", payload=encode(1), created_at=now
    )
    update = row.updates.create(
        run_id=row.run_id, name="approve", payload=encode(1), idempotency_key="u", created_at=now
    )
    with engine("e1") as e1:
        acquire(e1, "w", 5, "e1")
        for seq in (0, 1):
            with e1.transaction():
                lock(e1, "w")
                write_step(e1, row, seq, 5, kind="signal")
                e1.execute(
                    "UPDATE weft_django_bufferedsignal SET state = 'consumed', consumed_seq = %s WHERE id = %s",
                    [seq, signal.pk],
                )
        for status in ("completed", "rejected"):
            with e1.transaction():
                lock(e1, "w")
                e1.execute("UPDATE weft_django_pendingupdate SET status = %s WHERE id = %s", [status, update.pk])
    double = found()["A4 no double consumption or settlement"]
    assert any("consumed signal changed again" in v for v in double), double
    assert any("a settled update settled again" in v for v in double), double


def test_a_step_durable_before_the_step_before_it(audited: None) -> None:
    """Issue 21 item 1's shape: the update step (seq 1) commits while the activity (seq 0) is still
    running; the activity's result commits afterwards."""
    row = start("w")
    update = row.updates.create(
        run_id=row.run_id, name="approve", payload=encode(1), idempotency_key="u", created_at=timezone.now()
    )
    with engine("e1") as e1:
        acquire(e1, "w", 5, "e1")
        with e1.transaction():
            lock(e1, "w")
            write_step(e1, row, 0, 5, status="running")
        with e1.transaction():  # deliver_messages' own fenced transaction
            lock(e1, "w")
            e1.execute(
                "INSERT INTO weft_django_step (workflow_id, run_id, seq, kind, name, status, result, attempts,"
                " epoch, started_at, completed_at)"
                " VALUES ('w', %s, 1, 'update', 'approve', 'completed', %s, 0, 5, now(), now())",
                [row.run_id, encode({"update_id": str(update.pk), "payload": 1})],
            )
            e1.execute("UPDATE weft_django_pendingupdate SET status = 'accepted' WHERE id = %s", [update.pk])
        with e1.transaction():  # the pass's batch commit
            lock(e1, "w")
            write_step(e1, row, 0, 5)
    order = found()["A5 durable in the order made"]
    assert any("durable before seq 0 settled" in v for v in order), order
    assert any("answered (taken at seq 1) while seq 0 settled later" in v for v in order), order


def test_an_acknowledged_signal_left_buffered_on_a_finished_run(audited: None) -> None:
    row = start("w")
    BufferedSignal.objects.create(
        workflow=row, run_id=row.run_id, name="late", signal_id="late", payload=encode(1), created_at=timezone.now()
    )
    Workflow.objects.filter(pk="w").update(status="completed")  # (as a client: also reported by A1's client rule)
    violations, _ = audit.check_audit(
        [AckedMessage("w", "signal", "late"), AckedMessage("w", "update", "nope", via="wait")], SEQUENTIAL
    )
    missing = violations["A6 acknowledged messages in the final history"]
    assert any("still buffered on a completed run" in v for v in missing), missing
    assert any("'nope': 0 completed rows" in v for v in missing), missing
    assert any("a client ended a run" in v for v in violations["A1 fenced writes (no stale epoch, no non-holder)"])


def test_uninstall_leaves_no_trigger(audited: None) -> None:
    audit.uninstall()
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'weft_audit'")
        assert cursor.fetchone()[0] == 0
    audit.install()  # the fixture removes it again
