"""Children across a continue-as-new chain (issue 18's review): the default child id of a later run
differs from the first run's, a child-end record of an earlier run never settles a later run's child
step, and the late carry-over skips a signal id the current run already has."""

from __future__ import annotations

import logging

import pytest
from django.db import connections

import weft_django as weft
from tests.testapp import deploy_chain  # noqa: F401 - registers tests.deploys.child_chain
from weft_django.codec import encode
from weft_django.conf import database_alias
from weft_django.engine.engine import Engine
from weft_django.engine.periodic import PeriodicTask
from weft_django.models import BufferedSignal, ContinuedRun, Step, Workflow
from weft_django.store import continuation, mailbox
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _runs(workflow_id: str) -> tuple[str, str]:
    (row,) = ContinuedRun.objects.filter(workflow_id=workflow_id)
    return str(row.run_id), str(row.next_run_id)


def _continue(workflow_id: str, ids: list[str | None]) -> tuple[str, str]:
    handle = weft.start("tests.deploys.child_chain", args=[0, ids], id=workflow_id)
    run_until_idle()
    handle.signal("stop")  # run 0's child loses the race and is abandoned; run 1 starts its own
    run_until_idle()
    return _runs(workflow_id)


def test_a_later_run_of_a_chain_gets_its_own_default_child_id():
    old, new = _continue("cc-default", [None, None])
    seq = Step.objects.get(run_id=old, kind="child").seq
    assert Step.objects.get(run_id=new, kind="child").seq == seq
    assert str(Workflow.objects.get(id=f"cc-default/{seq}").parent_run_id) == old  # the first run's: unchanged
    child = Workflow.objects.get(id=f"cc-default/{new}/{seq}")  # a later run's default names its run
    assert str(child.parent_run_id) == new and child.status == "running"
    weft.get_handle(f"cc-default/{new}/{seq}").signal("go", "mine")
    run_until_idle()
    assert weft.get_handle("cc-default").result(timeout=10) == "mine"


def test_an_earlier_runs_child_end_is_not_carried_to_the_later_run():
    old, new = _continue("cc-explicit", ["cc-explicit-a", "cc-explicit-b"])
    seq = Step.objects.get(run_id=old, kind="child").seq
    assert Step.objects.get(run_id=new, kind="child").seq == seq
    weft.get_handle("cc-explicit-a").signal("go", "old child")  # ends after its parent run continued
    run_until_idle()
    assert continuation.carry_late(database_alias()) == 0  # its record stays with the run it was for
    (record,) = BufferedSignal.objects.filter(workflow_id="cc-explicit", name=mailbox.child_mailbox_name(seq))
    assert str(record.run_id) == old
    assert mailbox.drop_late_signals(database_alias()) == 1
    assert BufferedSignal.objects.get(pk=record.pk).state == "dropped"
    run_until_idle()
    assert Workflow.objects.get(id="cc-explicit").status == "running"
    weft.get_handle("cc-explicit-b").signal("go", "new child")
    run_until_idle()
    assert weft.get_handle("cc-explicit").result(timeout=10) == "new child"


def test_continuing_drops_the_old_runs_child_end_records_and_carries_its_signals():
    handle = weft.start("tests.signals", id="cc-carry")
    old = str(Workflow.objects.get(id=handle.id).run_id)
    new = "0f0f0f0f-0000-4000-8000-000000000001"
    now = Workflow.objects.get(id=handle.id).updated_at
    child_end = mailbox.child_mailbox_name(0)
    BufferedSignal.objects.create(workflow_id=handle.id, run_id=old, name="go", payload="1", created_at=now)
    BufferedSignal.objects.create(
        workflow_id=handle.id, run_id=old, name=child_end, signal_id=child_end, payload="{}", created_at=now
    )
    continuation.carry(handle.id, old, new, now, database_alias())
    rows = {row.name: (str(row.run_id), row.state) for row in BufferedSignal.objects.filter(workflow_id=handle.id)}
    assert rows == {"go": (new, "buffered"), child_end: (old, "dropped")}


def test_a_stale_child_end_record_does_not_settle_another_childs_step():
    _, new = _continue("cc-stale", ["cc-stale-a", "cc-stale-b"])
    seq = Step.objects.get(run_id=new, kind="child").seq
    # A record of another child under this run's mailbox name (carried by an engine before the fix).
    stale = BufferedSignal.objects.create(
        workflow_id="cc-stale",
        run_id=new,
        name=mailbox.child_mailbox_name(seq),
        payload=encode({"child_id": "cc-stale-a", "status": "completed", "result": encode("old"), "error": None}),
        created_at=Workflow.objects.get(id="cc-stale").updated_at,
    )
    run_until_idle()
    assert Step.objects.get(run_id=new, seq=seq).status == "running"
    assert BufferedSignal.objects.get(pk=stale.pk).state != "buffered"  # taken out of the way, not delivered
    assert Workflow.objects.get(id="cc-stale").status == "running"


def test_the_late_carry_skips_a_signal_id_the_current_run_already_has():
    handle = weft.start("tests.deploys.counter", args=[1, 0], id="cc-dup")
    handle.signal("add", 1)
    run_until_idle()
    old, _ = _runs(handle.id)
    handle.signal("add", 2, signal_id="dup")  # to the current run
    late = BufferedSignal.objects.create(  # the same id, committed for the old run by a sender that read it before
        workflow_id=handle.id,
        run_id=old,
        name="add",
        signal_id="dup",
        payload="5",
        created_at=Workflow.objects.get(id=handle.id).updated_at,
    )
    assert continuation.carry_late(database_alias()) == 0
    assert str(BufferedSignal.objects.get(pk=late.pk).run_id) == old
    assert mailbox.drop_late_signals(database_alias()) == 1  # a duplicate of a delivered id, as on one run
    run_until_idle()
    assert handle.result(timeout=10) == {"runs": 3, "total": 3}


def test_the_late_carry_skips_an_update_key_the_current_run_already_has():
    from weft_django.models import PendingUpdate

    handle = weft.start("tests.deploys.counter", args=[1, 0], id="cc-dup-update")
    handle.signal("add", 1)
    run_until_idle()
    old, new = _runs(handle.id)
    now = Workflow.objects.get(id=handle.id).updated_at
    fields = {"workflow_id": handle.id, "name": "bump", "payload": "1", "idempotency_key": "k", "created_at": now}
    PendingUpdate.objects.create(run_id=new, **fields)
    late = PendingUpdate.objects.create(run_id=old, **fields)  # the same key, admitted to the old run
    assert continuation.carry_late(database_alias()) == 0
    assert str(PendingUpdate.objects.get(pk=late.pk).run_id) == old  # the sweep fails it as an ended run's


def test_a_failing_periodic_chore_is_logged_and_the_others_still_run(caplog):
    handle = weft.start("tests.signals", id="cc-chores")
    ran: list[str] = []

    def failing(engine: Engine, now: object) -> bool:
        with connections[engine.using].cursor() as cursor:  # a real database error
            cursor.execute("SELECT no_such_column FROM weft_django_workflow")
        return True

    def after(engine: Engine, now: object) -> bool:
        ran.append("after")
        return False

    engine = Engine("cc-chores-engine")
    hourly = lambda e: 3600.0  # noqa: E731 - due on the first pass only
    engine.periodic = [PeriodicTask("failing", hourly, failing), PeriodicTask("after", hourly, after)]
    with caplog.at_level(logging.INFO, logger="weft_django.engine.engine"):
        engine.run_until_idle()
    assert ran == ["after"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("periodic chore failed" in m and "failing" in m for m in messages)
    assert not any("database error in tick" in m for m in messages)
    handle.signal("go", "still driven")
    run_until_idle()
    assert handle.result(timeout=10) == "still driven"


def test_the_late_carry_moves_one_of_two_old_runs_signals_with_the_same_id():
    """Review defect: two late signals with one id, on two earlier runs of a chain, were both moved to
    the current run in one UPDATE (IntegrityError on weft_signal_id_per_run, on every sweep)."""
    handle = weft.start("tests.deploys.counter", args=[0, 0], id="cc-two-old")
    for _ in range(2):
        handle.signal("add", 1)
        run_until_idle()
    chain = list(ContinuedRun.objects.filter(workflow_id=handle.id).order_by("finished_at").values_list("run_id"))
    assert len(chain) == 2
    now = Workflow.objects.get(id=handle.id).updated_at
    for (run_id,) in chain:  # the same signal id sent to each old run by senders that read it before
        BufferedSignal.objects.create(
            workflow_id=handle.id, run_id=run_id, name="add", signal_id="twice", payload="5", created_at=now
        )
    assert continuation.carry_late(database_alias()) == 1
    assert mailbox.drop_late_signals(database_alias()) == 1  # the other is a duplicate of the carried id
    run_until_idle()
    assert handle.result(timeout=10) == {"runs": 3, "total": 7}


@weft.activity(name="tests.deploys.noop_local", local=True)
def _noop_local() -> str:
    return "fast"


@weft.workflow(name="tests.deploys.child_then_continue")
def _child_then_continue(ctx, n: int):  # type: ignore[no-untyped-def]
    """Run 0 asks for a child and, in the same pass, a local activity wins the race and the run
    continues as new: the child's start and the continuation are in one commit."""
    if n == 0:
        yield ctx.race([ctx.start_child("tests.signals", id="cn-same-commit-kid"), ctx.run(_noop_local)])
        return ctx.continue_as_new(1)
    return "done"


def test_a_child_asked_for_in_the_commit_that_continues_the_run_is_not_left_running():
    """A run that continues as new closes its children per their policy before the commit starts the
    children it asked for: a child started after that escaped its ``terminate`` policy and kept running
    as the child of a run that had ended (found by a helper's review, session 17). A run that ends in
    the commit that asked for a child never starts it; one that continues now does the same."""
    handle = weft.start("tests.deploys.child_then_continue", args=[0], id="cn-same-commit")
    run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert ContinuedRun.objects.filter(workflow_id=handle.id).exists()
    assert not Workflow.objects.filter(pk="cn-same-commit-kid", status="running").exists()


@weft.workflow(name="tests.deploys.slow_kid")
def _slow_kid(ctx):  # type: ignore[no-untyped-def]
    yield ctx.sleep("10s")
    return "kid done"


@weft.workflow(name="tests.deploys.race_kid_then_continue")
def _race_kid_then_continue(ctx, n: int):  # type: ignore[no-untyped-def]
    if n == 0:
        yield ctx.race([ctx.start_child("tests.deploys.slow_kid", id="cn-kid-ends-too"), ctx.sleep("10s")])
        return ctx.continue_as_new(1)
    return "done"


def test_a_child_that_ends_in_the_commit_that_continues_its_parent_keeps_its_own_end(weft_clock):
    """The parent continues as new and its (terminate-policy) child completes in the same commit. The
    child's end stands: the continuation finds it no longer active. On the ORM path (SQLite) the
    continuation ran before the batch's ends were written, cancelled the child, and the child's own
    end then overwrote that (a completed row with a cancel reason, two end events; found by a
    helper's review, session 17)."""
    handle = weft.start("tests.deploys.race_kid_then_continue", args=[0], id="cn-kid-parent")
    run_until_idle()
    assert Workflow.objects.get(pk="cn-kid-ends-too").status == "running"
    weft_clock.advance(11)  # both sleeps are due: one pass ends the child and continues the parent
    run_until_idle()
    assert handle.result(timeout=5) == "done"
    kid = Workflow.objects.get(pk="cn-kid-ends-too")
    assert (kid.status, kid.cancel_reason) == ("completed", None)
