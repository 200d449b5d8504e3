"""Ownership under faults: a frozen engine is taken over and its late writes are refused."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.engine import fencing, ownership
from weft_django.engine.driver import StepRecord
from weft_django.models import Step, WorkflowClaim
from weft_django.store import claims as store_claims
from weft_django.store import commit as store_commit
from weft_django.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
FAST_WEFT = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}
FAST = {"WEFT_TEST_OVERRIDES": json.dumps(FAST_WEFT)}


def _claim(engine_id: str, workflow_id: str) -> int:
    got = ownership.acquire(engine_id, limit=10, ttl=_td(30), renew_interval=_td(5), using="default")
    return got[workflow_id][0]


def _td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _expire(workflow_id: str) -> None:
    WorkflowClaim.objects.filter(workflow_id=workflow_id).update(expires_at="2000-01-01T00:00:00Z")


def test_a_deposed_engine_cannot_commit():
    handle = weft.start("tests.sum", args=[1, 2], id="fence-1")
    old_epoch = _claim("engine-a", "fence-1")
    _expire("fence-1")
    got = ownership.acquire("engine-b", limit=10, ttl=_td(30), renew_interval=_td(5), using="default", takeover=True)
    assert got["fence-1"][1] == "engine-a" and got["fence-1"][0] > old_epoch
    writes = store_commit.WorkflowWrites(
        "fence-1",
        str(handle.describe()["run_id"]),
        old_epoch,
        steps=[StepRecord(0, "activity", "x", "completed", "1")],
    )
    from weft_django.store.clock import db_now

    result = fencing.fenced_commit("engine-a", [writes], db_now(), "default")
    assert result.committed == set() and result.lost == {"fence-1": "deposed"}
    assert not Step.objects.filter(workflow_id="fence-1").exists()


def test_takeover_never_steals_a_live_claim():
    weft.start("tests.sum", args=[1, 2], id="fence-2")
    _claim("engine-a", "fence-2")
    got = ownership.acquire("engine-b", limit=10, ttl=_td(30), renew_interval=_td(5), using="default", takeover=True)
    assert got == {}
    assert WorkflowClaim.objects.get(workflow_id="fence-2").engine_id == "engine-a"


def test_renewal_skips_a_row_held_by_a_commit_without_losing_it():
    weft.start("tests.sum", args=[1, 2], id="fence-3")
    epoch = _claim("engine-a", "fence-3")
    if connection.vendor != "postgresql":
        pytest.skip("row locks are a PostgreSQL matter; SQLite serialises writers")
    import threading

    held = threading.Event()
    release = threading.Event()

    def commit_in_flight():
        with transaction.atomic():
            store_claims.lock_claims("engine-a", {"fence-3": epoch}, "default")
            held.set()
            release.wait(10)
        from django.db import connections

        connections.close_all()

    thread = threading.Thread(target=commit_in_flight)
    thread.start()
    held.wait(10)
    lost = ownership.renew("engine-a", {"fence-3": epoch}, _td(30), "default")
    release.set()
    thread.join()
    assert lost == set()  # skipped, not lost


def _held_by_engine_a(*ids: str) -> dict[str, int]:
    """Start these workflows and let engine-a acquire them; returns their epochs."""
    for wid in ids:
        weft.start("tests.sum", args=[1, 2], id=wid)
    got = ownership.acquire("engine-a", limit=10, ttl=_td(30), renew_interval=_td(5), using="default")
    return {wid: got[wid][0] for wid in ids}


@contextlib.contextmanager
def _rows_held_by_a_user_transaction(*workflow_ids: str) -> Iterator[None]:
    """These claim rows locked (FOR UPDATE) by another connection's open transaction, for the block."""
    from django.db import connections

    held, release = threading.Event(), threading.Event()

    def user_transaction() -> None:
        with transaction.atomic():
            list(WorkflowClaim.objects.select_for_update().filter(workflow_id__in=workflow_ids))
            held.set()
            release.wait(30)
        connections.close_all()

    thread = threading.Thread(target=user_transaction)
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        thread.join()


@pytest.mark.postgres
def test_renewal_updates_without_locking_first_and_waits_only_briefly_for_a_row_a_transaction_holds():
    """The usual chunk is one plain UPDATE (no row lock taken before it: a third less time and WAL).
    A row a user's open transaction holds makes that UPDATE give up after PLAIN_LOCK_WAIT_MS; the chunk
    is renewed again skipping the row, which is neither renewed nor lost. The holder here never lets go
    while the renewal runs: a renewal that waited for it would never return."""

    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    ids = [f"plain-{i}" for i in range(3)]
    epochs = _held_by_engine_a(*ids)
    with CaptureQueriesContext(connections["default"]) as quiet:
        assert ownership.renew("engine-a", epochs, _td(30), "default") == set()
    assert not any("SKIP LOCKED" in q["sql"] for q in quiet.captured_queries)
    before = dict(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("workflow_id", "expires_at"))
    with _rows_held_by_a_user_transaction("plain-1"), CaptureQueriesContext(connections["default"]) as busy:
        lost = ownership.renew("engine-a", epochs, _td(60), "default")
    assert lost == set()  # skipped, not lost
    assert any("SKIP LOCKED" in q["sql"] for q in busy.captured_queries)  # the chunk again, skipping
    after = dict(WorkflowClaim.objects.filter(workflow_id__in=ids).values_list("workflow_id", "expires_at"))
    assert after["plain-1"] == before["plain-1"]
    assert after["plain-0"] > before["plain-0"] and after["plain-2"] > before["plain-2"]


@pytest.mark.postgres
def test_after_one_chunk_waited_for_a_held_row_the_passs_later_chunks_skip_at_once(monkeypatch):
    """A row held past PLAIN_LOCK_WAIT_MS is likely a user's open transaction that holds more rows: the
    chunks after it in the same pass skip locked rows at once instead of waiting PLAIN_LOCK_WAIT_MS
    each (with many chunks, the wait added up), in one call of the store's renewal and across the
    engine's renewal groups (one call each; a helper's review found the first version reset it per
    call). The next pass tries the plain form again."""
    import types

    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from weft_django.engine import renewal as engine_renewal
    from weft_django.engine.wake import Wake
    from weft_django.store.claims import renewal

    monkeypatch.setattr(renewal, "RENEW_CHUNK", 2)
    ids = [f"held-{i}" for i in range(6)]
    epochs = _held_by_engine_a(*ids)
    # The engine's renewal thread: one call of renew_each per group (PACED_GROUP claims), one pass.
    monkeypatch.setattr(engine_renewal, "PACED_GROUP", 2)
    settings = types.SimpleNamespace(workflow_claim_ttl=_td(60))
    thread = engine_renewal.Renewal("engine-a", settings, "default", _td(0), Wake("held"), None, lambda exc: None)  # type: ignore[arg-type]
    thread.publish({wid: types.SimpleNamespace(epoch=epoch) for wid, epoch in epochs.items()})

    def renewal_pass() -> list[str]:
        with CaptureQueriesContext(connections["default"]) as captured:
            thread._renew(*thread.due(0.0), 0.0, threading.Event())
        renewals = [q["sql"] for q in captured.captured_queries if "weft_django_workflowclaim" in q["sql"]]
        return ["skip" if "SKIP LOCKED" in sql else "plain" for sql in renewals if "UPDATE" in sql]

    for renew in (lambda: ownership.renew("engine-a", epochs, _td(60), "default"), renewal_pass):
        with (
            _rows_held_by_a_user_transaction("held-0", "held-2"),
            CaptureQueriesContext(connections["default"]) as busy,
        ):
            renew()
        renewals = [q["sql"] for q in busy.captured_queries if "weft_django_workflowclaim" in q["sql"]]
        kinds = ["skip" if "SKIP LOCKED" in sql else "plain" for sql in renewals if "UPDATE" in sql]
        assert kinds == ["plain", "skip", "skip", "skip"]  # chunk 1 waited, then skipped; 2 and 3 skip at once
    assert renewal_pass() == ["plain", "plain", "plain"]  # the next pass tries the plain form again


def test_renewal_reports_a_claim_taken_by_another_epoch():
    weft.start("tests.sum", args=[1, 2], id="fence-4")
    epoch = _claim("engine-a", "fence-4")
    _expire("fence-4")
    ownership.acquire("engine-b", limit=10, ttl=_td(30), renew_interval=_td(5), using="default", takeover=True)
    assert ownership.renew("engine-a", {"fence-4": epoch}, _td(30), "default") == {"fence-4"}


def test_renewal_runs_in_chunks_and_reports_what_each_lost(monkeypatch):
    """On PostgreSQL one statement per RENEW_CHUNK claims, each its own transaction (one statement
    over every held claim kept them all locked while it ran: 4 s at 500,000, and every commit for
    those workflows deferred meanwhile)."""
    if connection.vendor != "postgresql":
        pytest.skip("the chunks are PostgreSQL's form; SQLite renews in one transaction")
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from weft_django.store.claims import renewal

    monkeypatch.setattr(renewal, "RENEW_CHUNK", 2)
    ids = [f"chunk-{i}" for i in range(5)]
    epochs = _held_by_engine_a(*ids)
    _expire("chunk-3")
    ownership.acquire("engine-b", limit=10, ttl=_td(30), renew_interval=_td(5), using="default", takeover=True)
    _expire("chunk-0")  # still ours: renewed again
    with CaptureQueriesContext(connections["default"]) as captured:
        lost = ownership.renew("engine-a", epochs, _td(30), "default")
    assert lost == {"chunk-3"}
    updates = [q for q in captured.captured_queries if "UPDATE weft_django_workflowclaim" in q["sql"]]
    assert len(updates) == 3  # 2 + 2 + 1
    from weft_django.store.clock import db_now

    mine = WorkflowClaim.objects.filter(engine_id="engine-a")
    assert sorted(mine.values_list("workflow_id", flat=True)) == ["chunk-0", "chunk-1", "chunk-2", "chunk-4"]
    assert all(claim.expires_at > db_now() for claim in mine)


@pytest.mark.subprocess
def test_frozen_engine_is_taken_over_and_its_late_result_is_refused(weft_engines):
    handle = weft.start("tests.slow", args=["frozen", 2, 2.5], id="frozen")
    zombie = weft_engines("zombie", "-v", "2", weft=FAST_WEFT)
    wait_for(lambda: ActivityCall.objects.filter(key="frozen-0").exists(), timeout=30, message="first activity")
    # SIGSTOP mid-activity (outside a write: on SQLite a writer frozen in its write would block the
    # rescuer's takeover for good), then wait past the claim's TTL + grace on the database clock.
    frozen = zombie.freeze_past_claim()
    rescuer = weft_engines("rescuer", "-v", "2", weft=FAST_WEFT)
    assert frozen.wait_for_takeover() == {"frozen": "rescuer"}
    assert handle.result(timeout=60) == ["frozen-0", "frozen-1"]
    # Thaw, wait until it renewed again, stop it gracefully (its finished attempt meets the fence).
    refused = frozen.assert_writes_refused()
    rescuer.stop()
    # The zombie's finished attempt was either refused at the fence or discarded after it saw the loss.
    assert refused == {"frozen"}, zombie.output()[-3000:]
    # (I1) one Step per seq, all committed under the rescuer's epoch.
    steps = list(Step.objects.filter(workflow_id="frozen").values_list("seq", "epoch"))
    assert len(steps) == 2
    rescuer_epoch = WorkflowClaim.objects.get(workflow_id="frozen").epoch
    assert {epoch for _, epoch in steps} == {rescuer_epoch}


def test_engines_of_another_mode_refuse_to_start_until_the_marker_is_reset():
    from django.core.management import call_command

    from weft_django.exceptions import OwnershipModeMismatchError
    from weft_django.models import Engine, OwnershipMarker

    ownership.check_mode_marker("first", "workflow-lease", "default")
    ownership.check_mode_marker("second", "workflow-lease", "default")  # same mode: fine
    with pytest.raises(OwnershipModeMismatchError, match=r"OWNERSHIP='workflow-lease'.*OWNERSHIP='none'"):
        ownership.check_mode_marker("third", "none", "default")
    assert OwnershipMarker.objects.get().mode == "workflow-lease"
    assert not Engine.objects.exists()
    call_command("weft_engine", "--reset-ownership-mode")
    ownership.check_mode_marker("third", "none", "default")
    assert OwnershipMarker.objects.get().mode == "none"


def test_the_mode_marker_is_not_reset_while_an_engine_heartbeats():
    from django.core.management import CommandError, call_command

    from weft_django.models import Engine, OwnershipMarker
    from weft_django.store.clock import db_now

    ownership.check_mode_marker("first", "workflow-lease", "default")
    now = db_now()
    Engine.objects.create(id="alive-1", host="h", pid=1, mode="workflow-lease", started_at=now, heartbeat_at=now)
    with pytest.raises(CommandError, match=r"1 engine\(s\) still heartbeat \(alive-1\).*--force"):
        call_command("weft_engine", "--reset-ownership-mode")
    assert OwnershipMarker.objects.get().mode == "workflow-lease"
    call_command("weft_engine", "--reset-ownership-mode", "--force")
    assert not OwnershipMarker.objects.exists()


@pytest.mark.subprocess
def test_renewal_keeps_its_cadence_while_the_loop_is_blocked(weft_engines):
    handle = weft.start("tests.blocking_code", args=[6.0], id="blocked-loop")
    owner = weft_engines("busy", env=FAST)
    wait_for(lambda: WorkflowClaim.objects.filter(workflow_id="blocked-loop", engine_id="busy").exists(), timeout=30)
    epoch = WorkflowClaim.objects.get(workflow_id="blocked-loop").epoch
    rival = weft_engines("rival", env=FAST)
    assert handle.result(timeout=60) == 3
    # The loop was blocked for 6 s, twice the 3 s TTL, yet the claim was renewed throughout: no takeover.
    assert set(Step.objects.filter(workflow_id="blocked-loop").values_list("epoch", flat=True)) == {epoch}
    assert "took over" not in rival.output()
    owner.stop()
    rival.stop()
