"""How the engine's schedule pass retries a schedule whose firing raised (docs/schedules.md): a transient
database error (OperationalError) on the next pass; the row's own fault (DataError, IntegrityError, an
unusable row, any other exception) after FAILED_BACKOFF, so it does not fail again on every pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import DataError, IntegrityError, OperationalError

import weft_django as weft
from weft_django.conf import get_settings
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow

pytestmark = pytest.mark.django_db(transaction=True)
_real_fire = firing.fire


def engine() -> SimpleNamespace:
    return SimpleNamespace(using="default", settings=get_settings())


class Monotonic:
    """A stand-in for time.monotonic in the engine's schedule module (the back-off's clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _failing_fire(monkeypatch, error: Exception) -> list[str]:
    calls: list[str] = []

    def fire(row, workflow_id, definition, now, using):
        calls.append(workflow_id)
        raise error

    monkeypatch.setattr(firing, "fire", fire)
    return calls


@pytest.mark.parametrize("error", [DataError("value too long"), IntegrityError("constraint"), RuntimeError("bug")])
def test_a_schedule_whose_firing_raises_its_own_fault_is_retried_after_the_backoff(weft_clock, monkeypatch, error):
    """Before: a DataError or IntegrityError (a DatabaseError) was retried on every pass."""
    clock = Monotonic()
    monkeypatch.setattr(firing, "time", clock)
    calls = _failing_fire(monkeypatch, error)
    weft.schedule("tests.scheduled_run", id="faulty", every=60, overlap="allow")
    weft.schedule("tests.scheduled_run", id="good", every=60, overlap="allow")
    chore = firing.ScheduleFiring()
    weft_clock.advance(61)
    chore.run(engine(), weft_clock.now())
    assert len(calls) == 2  # both tried; each raised (fire is patched for every schedule)
    monkeypatch.setattr(firing, "fire", _real_fire)
    clock.now += 10
    weft_clock.advance(10)
    chore.run(engine(), weft_clock.now())  # the next pass: both are backed off, nothing is fired
    assert Workflow.objects.count() == 0
    clock.now += firing.FAILED_BACKOFF
    weft_clock.advance(firing.FAILED_BACKOFF)
    chore.run(engine(), weft_clock.now())  # a minute later: tried again, and fired
    assert sorted(Workflow.objects.values_list("schedule_id", flat=True)) == ["faulty", "good"]


def test_a_transient_database_error_is_retried_on_the_next_pass(weft_clock, monkeypatch):
    monkeypatch.setattr(firing, "time", Monotonic())
    calls = _failing_fire(monkeypatch, OperationalError("could not obtain lock"))
    weft.schedule("tests.scheduled_run", id="locked", every=60, overlap="allow")
    chore = firing.ScheduleFiring()
    weft_clock.advance(61)
    chore.run(engine(), weft_clock.now())
    chore.run(engine(), weft_clock.now())
    assert len(calls) == 2


def test_an_unusable_row_is_backed_off_and_logged_with_its_message(weft_clock, monkeypatch, caplog):
    monkeypatch.setattr(firing, "time", Monotonic())
    weft.schedule("tests.scheduled_run", id="odd", every=60, overlap="allow")
    Schedule.objects.filter(pk="odd").update(args="{not json")
    chore = firing.ScheduleFiring()
    weft_clock.advance(61)
    chore.run(engine(), weft_clock.now())
    assert any("cannot be used as stored: its args" in record.getMessage() for record in caplog.records)
    assert "odd" in chore._failed


def test_a_backed_off_schedule_still_releases_its_queued_run_and_is_not_fired_every_pass(
    weft_clock, monkeypatch, caplog
):
    """overlap="queue": a run waits; the row then fails to fire (args edited by hand) while its slot frees.
    Before: each pass found the schedule through its waiting run, released the run, tried the firing in
    the same transaction and rolled both back: the queued run never started, and the back-off was
    ignored (the failure logged on every pass)."""
    from weft_django.models import Timer

    monkeypatch.setattr(firing, "time", Monotonic())
    handle = weft.schedule("tests.signals", id="qodd", every=60, overlap="queue")
    first, queued = handle.trigger().id, handle.trigger().id
    Schedule.objects.filter(pk="qodd").update(args="{not json")
    weft.get_handle(first).cancel("the slot frees")
    weft_clock.advance(61)  # the occurrence is due: its firing raises UnusableScheduleError
    chore = firing.ScheduleFiring()
    for _ in range(3):
        chore.run(engine(), weft_clock.now())
    failures = [r for r in caplog.records if "cannot be used as stored" in r.getMessage()]
    released = Timer.objects.filter(workflow_id=queued, kind="delayed_start").exists()
    assert (released, len(failures)) == (True, 1)
