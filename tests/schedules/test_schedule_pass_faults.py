"""The schedule pass under faults: jitter as long as the period, a bad row among good ones, the lock
order of overlap="cancel_running", and the release of a queued run racing a cancel."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def engine() -> SimpleNamespace:
    return SimpleNamespace(using="default", settings=get_settings())


def test_jitter_longer_than_the_period_misses_nothing_on_a_live_engine(weft_clock):
    """every=60 with jitter="5m" (accepted by weft.schedule) and an engine polling every 10 s all along:
    no engine was down, so no occurrence may be counted as missed, and each one fires."""
    weft.schedule("tests.scheduled_run", id="jit", every=60, jitter="5m", overlap="allow")
    chore = firing.ScheduleFiring()
    for _ in range(6 * 30):  # 30 minutes, a pass every 10 s
        weft_clock.advance(10)
        chore.run(engine(), weft_clock.now())
    row = Schedule.objects.get(pk="jit")
    fired = Workflow.objects.filter(schedule_id="jit").count()
    assert (row.missed_fire_count, fired >= 24) == (0, True), (row.missed_fire_count, fired)


def test_two_jittered_occurrences_seen_due_in_one_pass_both_fire(weft_clock):
    """Occurrence k delayed by most of the period, k+1 by little: a pass a few seconds after both came
    due (a live engine polling every few seconds) must fire both, not count k as missed because k+1 came
    due before the pass saw k. Only a pass more than a period late coalesces (docs/schedules.md)."""
    from weft_django.schedules.timing import Timing

    weft.schedule("tests.scheduled_run", id="jit2", every=60, jitter="5m", overlap="allow")
    row = Schedule.objects.get(pk="jit2")
    timing = Timing.of(row)
    nominal = row.next_nominal_at
    for _ in range(20_000):  # a nominal time whose delay is long and whose next one's is short
        if timing.jitter(nominal) > timedelta(seconds=50) and timing.jitter(
            nominal + timedelta(seconds=60)
        ) < timedelta(seconds=5):
            break
        nominal += timedelta(seconds=60)
    else:  # pragma: no cover - the hash spreads delays evenly: one in about 120 qualifies
        pytest.fail("no such pair of occurrences")
    Schedule.objects.filter(pk="jit2").update(next_nominal_at=nominal, next_fire_at=timing.fire_at(nominal))
    second = nominal + timedelta(seconds=60)
    now = timing.fire_at(second) + timedelta(seconds=2)  # both due; the first by 10-16 s only
    firing.ScheduleFiring().run(engine(), now)
    row = Schedule.objects.get(pk="jit2")
    assert (row.missed_fire_count, Workflow.objects.filter(schedule_id="jit2").count()) == (0, 2)


FAR = "9999-12-31T23:59:00+00:00"
BAD_ROWS = {
    "bad-cron": {"cron": "not a cron", "every": None},
    "never-cron": {"cron": "0 0 30 2 *", "every": None},
    "bad-zone": {"cron": "* * * * *", "every": None, "timezone": "Mars/Olympus"},
    "zero-every": {"every": 0},
    "bad-args": {"args": "{not json"},
    "far-nominal": {"next_nominal_at": FAR},
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_one_bad_schedule_row_does_not_stop_the_others(weft_clock, name):
    weft.schedule("tests.scheduled_run", id="bad", every=60, overlap="allow")
    weft.schedule("tests.scheduled_run", id="good", every=60, overlap="allow")
    now = weft_clock.now()
    Schedule.objects.filter(pk="bad").update(next_fire_at=now - timedelta(seconds=1), **BAD_ROWS[name])
    weft_clock.advance(61)
    chore = firing.ScheduleFiring()
    chore.run(engine(), weft_clock.now())
    assert Workflow.objects.filter(schedule_id="good").count() == 1


@pytest.mark.postgres
def test_cancel_running_locks_the_claims_it_cancels_sorted_in_one_statement(weft_clock):
    """The project's lock order: the claims a transaction writes are locked sorted by workflow id, in
    one statement, before any other write. overlap="cancel_running" with two active runs (created in
    the opposite order of their ids) cancels them one transition at a time inside the pass's
    transaction: claim of the older run locked, run cancelled (writes), then the other claim."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from weft_django.models import WorkflowClaim

    handle = weft.schedule("tests.signals", id="cr", every=60, overlap="allow")
    manual = handle.trigger().id  # "cr@manual-..." : created first, sorts last
    nominal = handle.describe()["next_fire_times"][0]
    weft_clock.advance((nominal - weft_clock.now()).total_seconds() + 1)
    firing.ScheduleFiring().run(engine(), weft_clock.now())  # "cr@20..." : created second, sorts first
    occurrence = Workflow.objects.filter(schedule_id="cr").exclude(pk=manual).get().pk
    assert occurrence < manual
    handle.update(overlap="cancel_running")
    weft_clock.advance(60)
    table = WorkflowClaim._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        firing.ScheduleFiring().run(engine(), weft_clock.now())
    statements = [q["sql"] for q in queries.captured_queries]
    claim_locks = [
        i
        for i, sql in enumerate(statements)
        if table in sql and "FOR" in sql and "UPDATE" in sql.split("FOR", 1)[-1] and "SELECT" in sql[:10]
    ]
    first_write = next(i for i, sql in enumerate(statements) if sql.lstrip().startswith(("UPDATE", "INSERT", "DELETE")))
    first_lock = statements[claim_locks[0]]
    assert (manual in first_lock and occurrence in first_lock, claim_locks[0] < first_write) == (True, True), [
        statements[i][:160] for i in claim_locks
    ]


@pytest.mark.postgres
def test_releasing_a_queued_run_is_fenced_against_a_concurrent_cancel(weft_clock, monkeypatch):
    """release_waiting() writes the queued run's delayed-start timer without locking its claim: a
    cancel that commits between the pass's read of the active runs and that insert leaves a
    cancelled run with a pending delayed-start timer (an unfenced write of the run's state)."""
    import threading

    from django.db import connections

    from weft_django.models import Timer

    handle = weft.schedule("tests.signals", id="q", every=3600, overlap="queue")
    first = handle.trigger().id
    queued = handle.trigger().id
    assert Workflow.objects.get(pk=queued).status == "pending"
    weft.get_handle(first).cancel("slot frees")
    real = firing.active_runs

    def racing_active_runs(schedule_id, using):
        found = real(schedule_id, using)

        def cancel():
            try:
                weft.get_handle(queued).cancel("operator cancels the queued run")
            finally:
                connections.close_all()

        thread = threading.Thread(target=cancel)
        thread.start()
        thread.join(10)
        return found

    monkeypatch.setattr(firing, "active_runs", racing_active_runs)
    firing.ScheduleFiring().run(engine(), weft_clock.now())
    run = Workflow.objects.get(pk=queued)
    timers = list(Timer.objects.filter(workflow_id=queued).values_list("kind", flat=True))
    assert (run.status, timers) == ("cancelled", [])
