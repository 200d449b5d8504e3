"""The schedules API racing itself and the engine's schedule pass (PostgreSQL: threads, each on its
own connection, released together by a barrier; the pass is the engine's chore, run on a thread).

Each race is run for several rounds, and each round checks the outcome whichever side won: one row
per schedule id, at most one run per occurrence under overlap="skip", no run left waiting for a
schedule that is gone, a pause or a change never undone by the pass, and only typed errors
(ScheduleNotFoundError) reach the caller: no IntegrityError, no deadlock, no hang.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import transaction

import weft_django as weft
from tests.races import alternate, errors, race
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow
from weft_django.schedules import ScheduleNotFoundError

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 8
ACTIVE = ("running", "pending", "suspended")


def engine() -> SimpleNamespace:
    return SimpleNamespace(using="default", settings=get_settings())


def active(schedule_id: str) -> list[tuple[str, str]]:
    return list(
        Workflow.objects.filter(schedule_id=schedule_id, status__in=ACTIVE).order_by("pk").values_list("pk", "status")
    )


def due(schedule_id: str, clock) -> None:
    """Move workflow time one second past the schedule's next fire time."""
    upcoming = weft.get_schedule(schedule_id).describe()["next_fire_times"][0]
    clock.advance((upcoming - clock.now()).total_seconds() + 1)


def pass_at(now) -> bool:
    return firing.ScheduleFiring().run(engine(), now)


@pytest.mark.parametrize("in_callers_transaction", [False, True])
def test_two_upserts_of_one_new_schedule_make_one_row(in_callers_transaction):
    """Two weft.schedule() of the same new id at once: one inserts, the other's insert meets the key
    and updates the row instead (its own retry), also inside a caller's transaction (a savepoint)."""

    def declare(schedule_id: str, every: int):
        def call():
            if not in_callers_transaction:
                return weft.schedule("tests.scheduled_run", id=schedule_id, every=every)
            with transaction.atomic():
                return weft.schedule("tests.scheduled_run", id=schedule_id, every=every)

        return call

    for round_ in range(ROUNDS):
        schedule_id = f"upsert-{round_}"
        outcomes = race(declare(schedule_id, 60), declare(schedule_id, 120))
        assert errors(outcomes) == [], outcomes
        assert all(o == weft.get_schedule(schedule_id) for o in outcomes)
        row = Schedule.objects.get(pk=schedule_id)
        assert row.every in (60, 120)
        assert row.next_fire_at is not None and row.next_nominal_at is not None


def test_two_triggers_under_overlap_skip_start_one_run():
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.signals", id=f"skip-{round_}", every=3600, overlap="skip")
        outcomes = race(handle.trigger, handle.trigger)
        assert errors(outcomes) == [], outcomes
        started = [o for o in outcomes if o is not None]
        assert len(started) == 1, outcomes  # the second one saw the first's run, under the row lock
        assert active(handle.id) == [(started[0].id, "running")]


@pytest.mark.parametrize("overlap", ["skip", "queue"])
def test_a_trigger_racing_the_delete_leaves_no_run_waiting_for_a_gone_schedule(overlap):
    """trigger() and delete() both lock the schedule row: the trigger either comes first (its run
    starts, or waits under overlap="queue" and the delete then cancels it) or finds no schedule
    (ScheduleNotFoundError, nothing written)."""
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.signals", id=f"del-{overlap}-{round_}", every=3600, overlap=overlap)
        first = handle.trigger() if overlap == "queue" else None  # the queue's slot is taken
        triggered, deleted = race(handle.trigger, handle.delete, delays=alternate(round_))
        assert deleted is None, deleted
        assert not Schedule.objects.filter(pk=handle.id).exists()
        left = dict(active(handle.id))
        if isinstance(triggered, ScheduleNotFoundError):
            seen.add("delete first")
            assert left == ({first.id: "running"} if first else {})
            continue
        assert not isinstance(triggered, BaseException), triggered
        seen.add("trigger first")
        if overlap == "queue":
            # queued behind the first run; the delete cancelled it: nothing waits for a gone schedule
            assert Workflow.objects.get(pk=triggered.id).status == "cancelled"
            assert left == {first.id: "running"}
        else:
            assert left == {triggered.id: "running"}
    print(f"trigger vs delete ({overlap}):", sorted(seen))


def test_a_trigger_racing_the_engines_pass_starts_one_run_under_overlap_skip(weft_clock):
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.signals", id=f"tp-{round_}", every=3600, overlap="skip")
        due(handle.id, weft_clock)
        now = weft_clock.now()
        triggered, fired = race(handle.trigger, lambda now=now: pass_at(now), delays=alternate(round_))
        assert not isinstance(triggered, BaseException) and not isinstance(fired, BaseException), (triggered, fired)
        assert len(active(handle.id)) == 1, active(handle.id)
        seen.add("trigger started it" if triggered is not None else "the pass fired it")
        pass_at(now)  # a later pass (the row was skipped while the trigger held it) adds nothing
        assert len(active(handle.id)) == 1, active(handle.id)
    print("trigger vs pass:", sorted(seen))


def test_a_pause_racing_the_engines_pass_stays_paused(weft_clock):
    """The pass holds the row while it fires and advances it; a pause waits for it, or comes first and
    the pass (SKIP LOCKED, then reading the row under its lock) fires nothing. Never is the pause
    overwritten by the pass's save of the fire times."""
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.scheduled_run", id=f"pp-{round_}", every=3600, overlap="allow")
        due(handle.id, weft_clock)
        now = weft_clock.now()
        paused, fired = race(
            lambda h=handle: h.pause(note="race"), lambda now=now: pass_at(now), delays=alternate(round_)
        )
        assert paused is None and not isinstance(fired, BaseException), (paused, fired)
        row = Schedule.objects.get(pk=handle.id)
        assert (row.paused, row.note, row.next_fire_at) == (True, "race", None)
        runs = Workflow.objects.filter(schedule_id=handle.id).count()
        assert runs <= 1
        seen.add("pass first" if runs else "pause first")
        weft_clock.advance(7200)
        pass_at(weft_clock.now())
        assert Workflow.objects.filter(schedule_id=handle.id).count() == runs  # paused: nothing more
    print("pause vs pass:", sorted(seen))


def test_an_update_racing_the_engines_pass_keeps_the_new_timing(weft_clock):
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.scheduled_run", id=f"up-{round_}", every=3600, overlap="allow")
        due(handle.id, weft_clock)
        now = weft_clock.now()
        updated, fired = race(
            lambda h=handle: h.update(every=600), lambda now=now: pass_at(now), delays=alternate(round_)
        )
        assert updated is None and not isinstance(fired, BaseException), (updated, fired)
        row = Schedule.objects.get(pk=handle.id)
        assert row.every == 600
        # re-planned from the update's now (every=600, no jitter, rounded up to the second), whether the
        # pass fired before it or not
        assert now < row.next_nominal_at == row.next_fire_at <= weft_clock.now() + timedelta(seconds=601)
        fired_runs = Workflow.objects.filter(schedule_id=handle.id).count()
        assert fired_runs <= 1
        seen.add("pass first" if fired_runs else "update first")
    print("update vs pass:", sorted(seen))


def test_a_delete_racing_the_engines_pass_leaves_no_schedule_and_no_waiting_run(weft_clock):
    seen = set()
    for round_ in range(ROUNDS):
        handle = weft.schedule("tests.signals", id=f"dp-{round_}", every=3600, overlap="queue")
        first = handle.trigger()  # occupies the slot: the due occurrence is queued behind it
        due(handle.id, weft_clock)
        now = weft_clock.now()
        deleted, fired = race(handle.delete, lambda now=now: pass_at(now), delays=alternate(round_))
        assert deleted is None and not isinstance(fired, BaseException), (deleted, fired)
        assert not Schedule.objects.filter(pk=handle.id).exists()
        assert active(handle.id) == [(first.id, "running")]  # a queued occurrence was cancelled
        seen.add("pass first" if Workflow.objects.filter(schedule_id=handle.id).count() == 2 else "delete first")
        with pytest.raises(ScheduleNotFoundError):
            handle.trigger()
    print("delete vs pass:", sorted(seen))
