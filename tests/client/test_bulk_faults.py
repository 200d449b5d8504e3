"""Operations on many runs, purge, fork and the CLI under races: a bulk operation checks its selection
under each claim's lock, says which runs it could not change, `weft purge` keeps what the engine's
retention keeps, and a fork copies the steps it checked."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

import weft_django as weft
from weft_django import transitions
from weft_django.models import Workflow, WorkflowAttribute

pytestmark = pytest.mark.django_db(transaction=True)


def test_bulk_cancel_skips_a_run_started_again_under_the_same_id(monkeypatch):
    """docs/visibility.md: "One that no longer qualifies when its turn comes (it ended, was retried or
    started again) is skipped and listed in result.skipped". A run of the selection that ended and was
    started again (on_conflict="start_new") with attributes outside the filter is cancelled instead."""
    a = weft.start("visibility.waiter", args=["b7"], id="bc-a", attributes={"batch": "b7"}).id
    b = weft.start("visibility.waiter", args=["b7"], id="bc-b", attributes={"batch": "b7"}).id
    real_cancel = transitions.cancel
    done = []

    def cancel(workflow_id, reason=None, **kw):
        if not done:  # while the bulk operation works on "bc-a", "bc-b" ends and is started again
            done.append(True)
            real_cancel(b, "ended by someone else")
            weft.start("visibility.waiter", args=["b8"], id=b, on_conflict="start_new", attributes={"batch": "b8"})
        return real_cancel(workflow_id, reason, **kw)

    monkeypatch.setattr(transitions, "cancel", cancel)
    result = weft.bulk_cancel(attributes={"batch": "b7"}, expected_count=2, batch_size=2, reason="bad batch b7")
    row = Workflow.objects.get(pk=b)
    attrs = {w.name: w.str_value for w in WorkflowAttribute.objects.filter(workflow_id=b)}
    assert attrs == {"batch": "b8"}  # the run now under "bc-b" is not in the selection
    assert row.status == "running", (row.status, row.cancel_reason, result)
    assert result.skipped == [b]
    assert a


def test_cli_purge_by_retention_keeps_a_run_counted_in_its_queues_rate_window():
    """docs/cli.md: without --older-than, `weft purge` removes what WEFT["RETENTION"] says is due;
    docs/queues.md: retention keeps a run its queue admitted within the rate window, "whatever RETENTION
    says". The CLI's selection (admin/terminal.retention_due) ignores the rate window: the run is purged
    and the queue admits a second run within one day under "rate": "1/d"."""
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.test import override_settings

    from weft_django import conf
    from weft_django.store import queues
    from weft_django.store.clock import db_now

    ttl = timedelta(seconds=30)
    with override_settings(WEFT={"QUEUES": {"r": {"rate": "1/d"}}, "RETENTION": {"cancelled": "1m"}}):
        queue = conf.queues()["r"]
        weft.start("tests.queued_parks", id="rate-c1", queue="r")
        assert list(queues.admit("e1", queue, limit=5, ttl=ttl, using="default")) == ["rate-c1"]
        weft.cancel("rate-c1")
        Workflow.objects.filter(pk="rate-c1").update(finished_at=db_now("default") - timedelta(hours=1))
        out = StringIO()
        call_command("weft", "purge", "--yes", stdout=out, stderr=StringIO())
        weft.start("tests.queued_parks", id="rate-c2", queue="r")
        admitted = queues.admit("e1", queue, limit=5, ttl=ttl, using="default")
        assert admitted == {}, (out.getvalue(), admitted)  # one a day: rate-c1 still counts
        assert Workflow.objects.filter(pk="rate-c1").exists(), out.getvalue()


def test_bulk_retry_stopped_midway_by_one_run_says_what_it_changed():
    """A bulk operation must not be partly applied without saying which. bulk_retry catches only
    WorkflowTerminalError / WorkflowStateError / WorkflowNotFoundError per run: a run whose queue left
    WEFT["QUEUES"] raises UnknownQueueError out of the loop after the runs before it were retried and
    before the ones after it: the caller gets an error about one run and no word of the others."""
    from weft_django.exceptions import UnknownQueueError
    from weft_django.testing import run_until_idle

    ids = [weft.start("visibility.failing", args=["mid"], id=f"br-{n}").id for n in (1, 2, 3)]
    run_until_idle()
    assert set(Workflow.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"failed"}
    Workflow.objects.filter(pk="br-2").update(queue="gone")  # its queue was removed from the settings
    try:
        result = weft.bulk_retry(attributes={"batch": "mid"}, expected_count=3)
    except UnknownQueueError as exc:
        statuses = dict(Workflow.objects.filter(pk__in=ids).values_list("pk", "status"))
        raise AssertionError(("stopped midway", str(exc), statuses)) from exc
    assert (result.changed, list(result.errors), result.skipped) == (2, ["br-2"], [])
    assert "gone" in result.errors["br-2"]


@pytest.mark.postgres
def test_fork_copies_the_steps_it_checked_or_refuses(monkeypatch):
    """weft.fork checks the source's recorded steps (forks.recorded_steps), then reads them again to
    copy them (forks.copy_history), without locking the source: a purge (or start_new, or retry) of the
    source committed between the two reads leaves the new run with fewer steps than from_step, and the
    fork re-runs the steps the caller asked to keep (a charge made twice). It must copy what it
    checked, or refuse with nothing written."""
    import threading

    from django.db import connections

    from weft_django.models import Step
    from weft_django.store import forks
    from weft_django.testing import run_until_idle

    source = weft.start("visibility.order", args=["acme", 5.0], id="fork-race-src")
    run_until_idle()
    assert source.status == "completed"
    assert Step.objects.filter(workflow_id=source.id).count() >= 2
    real = forks.recorded_steps

    def recorded_then_purged(run_id, using):
        found = real(run_id, using)

        def purge():
            try:
                transitions.purge(source.id)
            finally:
                connections.close_all()

        thread = threading.Thread(target=purge)  # another client purges the source meanwhile
        thread.start()
        thread.join(2)  # it commits here unless the fork holds the source's claim (then it waits)
        threads.append(thread)
        return found

    threads: list[threading.Thread] = []

    monkeypatch.setattr(forks, "recorded_steps", recorded_then_purged)
    try:
        handle = weft.fork(source.id, from_step=2, new_id="fork-race-new")
    except weft.WeftError:
        assert not Workflow.objects.filter(pk="fork-race-new").exists()
        return
    finally:
        for thread in threads:
            thread.join(30)
    copied = Step.objects.filter(workflow_id=handle.id).count()
    assert copied == 2, f"the fork kept {copied} of the 2 steps it checked"
    assert not Workflow.objects.filter(pk=source.id).exists()  # the purge went ahead after the fork


def test_cli_bulk_retry_refuses_a_cancel_reason():
    """`weft bulk retry|purge --reason R` accepts the reason and drops it silently (bulk_command passes
    it only to cancel): a bad argument must be refused with nothing changed."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    from weft_django.testing import run_until_idle

    weft.start("visibility.failing", args=["why"], id="cli-reason-1")
    run_until_idle()
    out = StringIO()
    with pytest.raises(CommandError, match="--reason"):
        call_command("weft", "bulk", "retry", "--where", "batch=why", "--reason", "oops", "--yes", stdout=out)
    assert Workflow.objects.get(pk="cli-reason-1").status == "failed", out.getvalue()


@pytest.fixture
def no_retention(settings):
    settings.WEFT = {**getattr(settings, "WEFT", {}), "RETENTION": {"completed": None}}  # the engine's own sweep


def test_bulk_purge_leaves_a_new_run_outside_the_filter(monkeypatch, no_retention):
    """bulk_purge(ended_before=cutoff) reads a batch of ids, then purge_terminal locks them and checks
    only that each is terminal, not that it still matches the filter (nor that it is the run read).
    A run replaced meanwhile (on_conflict="start_new") by one that already ended, after the cutoff, is
    purged: the new run and its history are deleted though the filter never selected it."""
    from datetime import timedelta

    from weft_django import bulk
    from weft_django.store.clock import db_now
    from weft_django.testing import run_until_idle

    for wid in ("bp-a", "bp-b"):
        weft.start("visibility.order", args=["old", 1.0], id=wid)
    run_until_idle()
    long_ago = db_now("default") - timedelta(days=30)
    Workflow.objects.filter(pk__in=["bp-a", "bp-b"]).update(finished_at=long_ago)
    cutoff = db_now("default") - timedelta(days=7)
    real = transitions.purge_terminal

    def purge_terminal(ids, **kw):
        if "bp-b" in ids:  # between the batch's read and its lock, "bp-b" is started again and ends
            weft.start("visibility.order", args=["new", 2.0], id="bp-b", on_conflict="start_new")
            run_until_idle()
            assert Workflow.objects.get(pk="bp-b").status == "completed"
        return real(ids, **kw)

    monkeypatch.setattr(bulk.transitions, "purge_terminal", purge_terminal)
    result = weft.bulk_purge(ended_before=cutoff, expected_count=2, batch_size=10)
    assert not Workflow.objects.filter(pk="bp-a").exists()
    assert Workflow.objects.filter(pk="bp-b").exists(), result  # the new run ended after the cutoff


def test_a_fork_keeps_the_sources_execution_timeout():
    """A fork had no execution deadline though its source was started with one."""
    from datetime import timedelta

    from weft_django.testing import run_until_idle

    source = weft.start("visibility.order", args=["acme", 5.0], id="timed-src", execution_timeout="1h")
    run_until_idle()
    fork = weft.fork(source.id, from_step=0, new_id="timed-fork")
    row = Workflow.objects.get(pk=fork.id)
    assert row.execution_timeout == timedelta(hours=1)
    assert row.execution_deadline is not None


@pytest.mark.postgres
def test_a_fork_and_a_start_many_sharing_ids_do_not_fail_on_a_deadlock(monkeypatch):
    """fork(A, new_id=X) locks A's claim, then inserts X; start_many([X, A start_new]) inserts X, then
    locks A's claim: a deadlock, raised to one caller as a raw OperationalError. Each now runs again
    after a deadlock when it owns its transaction; the loser then meets the winner's rows (typed)."""
    weft.start("tests.sum", args=[1, 2], id="fk-A")
    Workflow.objects.filter(pk="fk-A").update(status="completed", result="3")
    fork_holds_a, start_many_inserted_x = threading.Event(), threading.Event()
    from weft_django.store import claims as store_claims
    from weft_django.store import forks

    real_recorded, real_lock_ids = forks.recorded_steps, store_claims.lock_ids
    main = threading.get_ident()

    def recorded(run_id, using):
        found = real_recorded(run_id, using)
        fork_holds_a.set()  # fork holds A's claim and row
        start_many_inserted_x.wait(5)
        return found

    def lock_ids(ids, using, **kw):
        if threading.get_ident() == main and ids:
            start_many_inserted_x.set()  # start_many has inserted X, now locks A
        return real_lock_ids(ids, using, **kw)

    monkeypatch.setattr(forks, "recorded_steps", recorded)
    monkeypatch.setattr(store_claims, "lock_ids", lock_ids)
    fork_errors: list[BaseException] = []

    def do_fork():
        try:
            weft.fork("fk-A", from_step=0, new_id="fk-X")
        except BaseException as exc:
            fork_errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=do_fork)
    thread.start()
    assert fork_holds_a.wait(10)
    start_error = None
    try:
        weft.start_many(
            [
                weft.StartRequest("tests.sum", args=[1, 2], id="fk-X"),
                weft.StartRequest("tests.sum", args=[1, 2], id="fk-A", on_conflict="start_new"),
            ]
        )
    except BaseException as exc:
        start_error = exc
    thread.join(30)
    errors = [e for e in [start_error, *fork_errors] if e is not None and not isinstance(e, weft.WeftError)]
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]


def test_a_purge_of_a_queryset_goes_past_a_batch_that_changed_meanwhile(monkeypatch):
    """purge(queryset) (weft purge, retention) stopped at the first batch that deleted nothing: rows
    that changed between the batch's read and its lock left every later due row unpurged."""
    from datetime import timedelta

    from weft_django.store.clock import db_now

    for n in range(3):
        weft.start("tests.sum", args=[1, 2], id=f"pq-{n}")
    Workflow.objects.filter(pk__startswith="pq-").update(status="completed", finished_at=db_now() - timedelta(days=30))
    due = Workflow.objects.filter(status="completed", finished_at__lt=db_now() - timedelta(days=7))
    real, changed = transitions._purge_batch, []

    def first_batch_changes(ids, using, **options):
        if "pq-0" in ids and not changed:  # it finished again (a new run) between the read and the lock
            Workflow.objects.filter(pk="pq-0").update(finished_at=db_now())
            changed.append(True)
        return real(ids, using, **options)

    monkeypatch.setattr(transitions, "_purge_batch", first_batch_changes)
    assert transitions.purge(due, batch_size=1) == 2
    assert list(Workflow.objects.filter(pk__startswith="pq-").values_list("pk", flat=True)) == ["pq-0"]
