"""SQLite: an atomic=True activity that holds the one write lock longer than the busy timeout.

While it runs, every pass of the engine that writes (the claim scan, a commit) waits for the lock,
gives up at the busy timeout ("database is locked") and reloads the workflows it drives at the same
epoch. The reload used to stop the attempt in flight, so its commit was refused after the function had
run, and the reloaded context ran the attempt again, which again outlasted the busy timeout: the
activity ran over and over and the workflow never finished. The attempt now goes on across a reload
(its commit is fenced: the claim at this epoch and the step still waiting for this very attempt).

The busy timeout is made short for the engine's connections (OPTIONS["timeout"], the setting
weft.W001 is about) so that an activity of 2.5 s outlasts it, as one of 25 s outlasts the
documented 20 s."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections

import weft_django as weft
from weft_django.testing import running_engine

from ..testapp.models import Reservation

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]
RUNS: list[float] = []


@weft.activity(atomic=True)
def sla_reserve(order_id: int) -> int:
    RUNS.append(time.monotonic())  # outside the database: counts every run, rolled back or not
    Reservation.objects.create(order_id=order_id)
    time.sleep(2.5)  # holds SQLite's write lock all along (its transaction is IMMEDIATE)
    return order_id


@weft.workflow(name="tests.sla_long_atomic")
def long_atomic(ctx: Any, order_id: int) -> Any:
    reserved = yield ctx.run(sla_reserve, order_id)
    return reserved


def test_an_atomic_activity_longer_than_the_busy_timeout_runs_once_and_completes(monkeypatch):
    RUNS.clear()
    monkeypatch.setitem(connections["default"].settings_dict["OPTIONS"], "timeout", 1)  # new connections
    handle = weft.start("tests.sla_long_atomic", args=[7])
    with running_engine("sqlite-long-atomic"):
        try:
            value = handle.result(timeout=15)
        except weft.WaitTimeoutError:
            value = None
    assert (value, len(RUNS)) == (7, 1), [round(at - RUNS[0], 1) for at in RUNS]
    assert list(Reservation.objects.values_list("order_id", flat=True)) == [7]
