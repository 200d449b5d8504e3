"""Damaged rows of a workflow's own history (timers, steps, applied updates, admitted updates) make that
workflow stuck with a reason that names the row and column, never leave it parked silently nor call
the damage "a bug in weft_django" (docs/concepts.md: one bad row stops one workflow, never the engine).

- A timer row of a kind weft never writes: it fired as nothing (deleted), its wait was armed again
  from now: the run waited on, unmarked, its wait's time moved.
- A timer whose ``seq`` is NULL (an ``activity_retry`` timer: AssertionError in the engine, reported as
  its bug) or, on SQLite, text (TypeError comparing it with the step numbers).
- An applied update whose ``seq`` is past the run's history: replay never reached it, so the handler's
  effect was silently missing from the replayed state.
- SQLite: a step whose ``seq`` is text, an update id that is no uuid (an admitted update's id, an
  applied update's ``update_id``).

Each writes the damage by hand in SQL into a real database, runs a real engine pass beside a healthy
workflow that must complete, and checks the damaged one's stuck reason.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from weft_django.models import AppliedUpdate, PendingUpdate, Step, Timer, Workflow
from weft_django.testing import run_until_idle, running_engine

from .test_damaged_rows_engine_paths import _sql  # and its workflows: counter, activity_then_signal

pytestmark = pytest.mark.django_db(transaction=True)

ROWS_UNREADABLE = "its rows cannot be read by the engine"
NOT_OURS = "bug in weft_django"


def _now_sql() -> str:
    return "datetime('now')" if connection.vendor == "sqlite" else "now()"


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR, logger="weft_django")
    return caplog


def _good_one_completes(caplog: pytest.LogCaptureFixture) -> None:
    """A healthy workflow started beside the damaged one completes, and no pass of the engine failed
    as a whole."""
    good = weft.start("tests.sum", args=[2, 3], id="good")
    run_until_idle(timeout=20)
    assert good.result(timeout=5) == {"total": 5}
    assert "database error in tick" not in caplog.text, caplog.text


def _stuck(workflow_id: str) -> str:
    """The damaged workflow's stuck message: it is running, marked stuck with a reason that is not
    "a bug in weft_django"."""
    status, stuck = Workflow.objects.values_list("status", "stuck_error").get(pk=workflow_id)
    assert status == "running" and stuck is not None, (status, stuck)
    message = str(stuck["message"])
    assert NOT_OURS not in message, message
    return message


def _parked(workflow: str, *args: Any) -> None:
    weft.start(workflow, args=list(args), id="damaged")
    run_until_idle(timeout=15)
    assert Workflow.objects.get(pk="damaged").status == "running"


# -- item 1: a timer of an unknown kind, a timer seq stored as text (SQLite) ------------------------
def test_a_timer_of_an_unknown_kind_makes_its_run_stuck(errors):
    """Before: the timer was loaded, fired as nothing and deleted, and the sleep armed again from now:
    the run stayed parked with no stuck mark (``assert 'running' ... and None is not None``)."""
    _parked("tests.sleeper", 3600)
    _sql(f"UPDATE {Timer._meta.db_table} SET kind = 'nap' WHERE workflow_id = 'damaged'")
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "kind" in message and "'nap'" in message, message


@pytest.mark.sqlite
def test_a_timer_whose_seq_is_text_makes_its_run_stuck(errors):
    _parked("tests.sleeper", 3600)
    _sql(f"UPDATE {Timer._meta.db_table} SET seq = 'first' WHERE workflow_id = 'damaged'")
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "seq" in message and "'first'" in message, message


# -- item 4: a timer seq NULL --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["activity_retry", "sleep"])
def test_a_timer_whose_seq_is_null_makes_its_run_stuck_with_the_row_named(errors, kind):
    """An activity_retry timer with seq NULL, due, beside a signal wait at step 0. Before: the engine
    took it for a retry of step 0 and failed an assertion: "This is a bug in weft_django"
    (AssertionError). A sleep's NULL seq was taken for step 0."""
    _parked("tests.damaged_engine_paths.counter")
    _sql(
        f"INSERT INTO {Timer._meta.db_table} (workflow_id, run_id, kind, seq, attempt, fire_at) "
        f"SELECT id, run_id, %s, NULL, 2, {_now_sql()} FROM {Workflow._meta.db_table} WHERE id = 'damaged'",
        [kind],
    )
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "seq" in message and "NULL" in message, message


# -- item 2: an applied update past the run's history ------------------------------------------------
def _bumped() -> None:
    """The counter parked at its signal wait (step 0) with its update "bump" 2 applied there."""
    _parked("tests.damaged_engine_paths.counter")
    with running_engine("bumps"):
        assert weft.get_handle("damaged").update("bump", 2, timeout=15) == 2


def test_an_applied_update_past_the_history_makes_its_run_stuck(errors):
    """The update was applied at step 0 (the signal wait); its row edited to step 7, where the run
    never was. Before: replay stopped at step 0 without re-applying it, and the run completed with 0
    instead of 2 (``AssertionError: ('completed', None)``)."""
    _bumped()
    assert list(AppliedUpdate.objects.values_list("seq", "name")) == [(0, "bump")]
    _sql(f"UPDATE {AppliedUpdate._meta.db_table} SET seq = 7")
    weft.get_handle("damaged").signal("go")
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert "update 'bump'" in message and "step 7" in message and "never reached" in message, message


def test_an_applied_update_at_the_frontier_is_sound(errors):
    """The same update left where it was applied: re-applied on replay, the run completes with it."""
    _bumped()
    weft.get_handle("damaged").signal("go")
    _good_one_completes(errors)  # a new engine: it replays the run, the update re-applied at step 0
    assert weft.get_handle("damaged").result(timeout=5) == 2


# -- item 4: SQLite text in a step's seq, an update id that is no uuid ---------------------------------
@pytest.mark.sqlite
def test_a_step_whose_seq_is_text_makes_its_run_stuck_with_the_row_named(errors):
    """Before: "the engine failed while handling it (TypeError: '>' not supported between instances of
    'str' and 'int'). This is a bug in weft_django"."""
    _parked("tests.damaged_engine_paths.activity_then_signal")
    _sql(f"UPDATE {Step._meta.db_table} SET seq = 'zero' WHERE workflow_id = 'damaged'")
    weft.get_handle("damaged").signal("go", 1)
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "seq" in message and "'zero'" in message, message


@pytest.mark.sqlite
def test_an_admitted_update_whose_id_is_no_uuid_is_named_not_called_a_bug(errors):
    _parked("tests.damaged_engine_paths.counter")
    _sql(
        f"INSERT INTO {PendingUpdate._meta.db_table} (id, workflow_id, run_id, name, payload, status, created_at) "
        f"SELECT 'not-a-uuid', id, run_id, 'bump', '2', 'admitted', datetime('now') "
        f"FROM {Workflow._meta.db_table} WHERE id = 'damaged'"
    )
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "id" in message and "'not-a-uuid'" in message, message


@pytest.mark.sqlite
def test_an_applied_update_whose_update_id_is_no_uuid_is_named(errors):
    _parked("tests.damaged_engine_paths.counter")
    _sql(
        f"INSERT INTO {AppliedUpdate._meta.db_table} (workflow_id, run_id, seq, n, name, payload, update_id) "
        f"SELECT id, run_id, 0, 0, 'bump', '2', 'not-a-uuid' FROM {Workflow._meta.db_table} WHERE id = 'damaged'"
    )
    weft.get_handle("damaged").signal("go")
    _good_one_completes(errors)
    message = _stuck("damaged")
    assert ROWS_UNREADABLE in message and "update_id" in message and "'not-a-uuid'" in message, message
