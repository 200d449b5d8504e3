"""Client calls on a row damaged by hand raise weft's typed errors or answer, never a raw DataError or
AttributeError (docs/concepts.md: a row that cannot be decoded stops that run, never the caller's
code). The timestamps are the PostgreSQL case: it keeps times past year 9999 and 'infinity', which
psycopg cannot convert, and every read of the row raised DataError.

- ``handle.result()`` read the run's created_at and execution_deadline (neither is needed to return
  the outcome);
- ``weft.start(idempotency_key=...)`` read the key row's created_at and purged_at;
- ``handle.update()`` answered again by its key read a rejected update's stored issues as a list of
  objects (AttributeError for any other JSON);
- the Tasks backend's ``get_result()`` read every timestamp of the run, its step and its claim;
- every ``ScheduleHandle`` method (and ``weft.schedule()``'s upsert, and the engine's firing pass) read
  the whole schedule row: one timestamp past year 9999 made the schedule impossible to pause, repair
  or even delete through the API.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

import weft_django as weft
from weft_django.engine import schedules as firing
from weft_django.models import Schedule, Workflow
from weft_django.testing import run_until_idle, running_engine

pytestmark = pytest.mark.django_db(transaction=True)
TOO_LATE = "'infinity'"


def _sql(statement: str, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


# -- result() -----------------------------------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize("column", ["created_at", "execution_deadline"])
def test_result_of_a_run_with_a_timestamp_python_cannot_hold_returns_its_value(column):
    handle = weft.start("tests.sum", args=[1, 2], id="damaged")
    run_until_idle(timeout=15)
    _sql(f"UPDATE weft_django_workflow SET {column} = {TOO_LATE} WHERE id = 'damaged'")
    assert handle.result(timeout=5) == {"total": 3}  # before: DataError


@pytest.mark.postgres
def test_result_of_a_timed_out_run_whose_deadline_python_cannot_hold_says_it_timed_out():
    handle = weft.start("tests.signals", id="damaged")
    _sql(f"UPDATE weft_django_workflow SET status = 'timed_out', execution_deadline = {TOO_LATE} WHERE id = 'damaged'")
    with pytest.raises(weft.WorkflowTimedOutError, match='Workflow "damaged" timed out'):
        handle.result(timeout=5)  # before: DataError


# -- start() with an idempotency key ----------------------------------------------------------------------
@pytest.mark.postgres
def test_a_start_with_a_key_whose_row_has_a_created_at_python_cannot_hold_finds_its_run():
    first = weft.start("tests.sum", args=[1, 1], idempotency_key="order-1")
    _sql(f"UPDATE weft_django_idempotencykey SET created_at = {TOO_LATE}")
    assert weft.start("tests.sum", args=[1, 1], idempotency_key="order-1") == first  # before: DataError


@pytest.mark.postgres
def test_a_start_with_a_purged_key_whose_purge_time_python_cannot_hold_says_it_was_purged():
    weft.start("tests.sum", args=[1, 1], idempotency_key="order-1")
    _sql(f"UPDATE weft_django_idempotencykey SET purged_at = {TOO_LATE}")
    with pytest.raises(weft.IdempotencyKeyPurgedError, match="whose run was purged or replaced"):
        weft.start("tests.sum", args=[1, 1], idempotency_key="order-1")  # before: DataError


# -- update() answered again by its key ------------------------------------------------------------------
@pytest.mark.parametrize("issues", ['"oops"', '{"message": "x"}', '[1, "two"]'])
def test_a_rejected_updates_stored_issues_of_another_shape_raise_update_validation_error(issues):
    handle = weft.start("tests.msg_counter", id="damaged")
    with running_engine("damaged-update"):
        with pytest.raises(weft.UpdateValidationError):
            handle.update("add", -1, idempotency_key="u1", timeout="10s")  # its validator refuses it
        _sql("UPDATE weft_django_pendingupdate SET issues = %s WHERE workflow_id = 'damaged'", [issues])
        with pytest.raises(weft.UpdateValidationError) as caught:  # before: AttributeError / TypeError
            handle.update("add", -1, idempotency_key="u1", timeout="10s")
    assert caught.value.issues and all(isinstance(issue, dict) for issue in caught.value.issues)


# -- the Tasks backend --------------------------------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize(
    ("table", "column", "field"),
    [
        ("workflow", "created_at", "enqueued_at"),
        ("workflow", "finished_at", "finished_at"),
        ("step", "started_at", "started_at"),
    ],
)
def test_get_result_of_a_task_with_a_timestamp_python_cannot_hold_shows_it_as_none(table, column, field):
    from tests.testapp.tasks import add
    from weft_django.tasks._compat import TaskResultStatus, task_backends

    enqueued = add.enqueue(1, 2)
    run_until_idle(timeout=15)
    key = "id" if table == "workflow" else "workflow_id"
    _sql(f"UPDATE weft_django_{table} SET {column} = {TOO_LATE} WHERE {key} = %s", [enqueued.id])
    result = task_backends["default"].get_result(enqueued.id)  # before: DataError
    assert (result.status, result.return_value, getattr(result, field)) == (TaskResultStatus.SUCCESSFUL, 3, None)


@pytest.mark.postgres
def test_get_result_of_a_task_whose_step_end_python_cannot_hold_dates_its_attempt_by_its_start():
    from tests.testapp.tasks import add
    from weft_django.tasks._compat import task_backends

    enqueued = add.enqueue(1, 2)
    run_until_idle(timeout=15)
    _sql(f"UPDATE weft_django_step SET completed_at = {TOO_LATE} WHERE workflow_id = %s", [enqueued.id])
    result = task_backends["default"].get_result(enqueued.id)  # before: DataError
    assert result.return_value == 3 and result.last_attempted_at == result.started_at is not None


# -- schedules -------------------------------------------------------------------------------------------
MOMENTS = ["next_fire_at", "next_nominal_at", "last_fired_at", "created_at", "updated_at"]


def _damaged_schedule(column: str) -> weft.ScheduleHandle:
    handle = weft.schedule("tests.scheduled_run", id="damaged", every=60, overlap="allow")
    _sql(f"UPDATE weft_django_schedule SET {column} = {TOO_LATE} WHERE id = 'damaged'")
    return handle


@pytest.mark.postgres
@pytest.mark.parametrize("column", MOMENTS)
def test_a_schedule_with_a_timestamp_python_cannot_hold_can_be_paused_resumed_updated_and_deleted(column):
    handle = _damaged_schedule(column)
    weft.schedule("tests.scheduled_run", id="damaged", every=60, overlap="allow")  # the upsert: before, DataError
    handle.pause()
    handle.resume()  # plans again from now
    handle.update(args=["repaired"])
    assert handle.describe()["args"] == ["repaired"]
    assert handle.trigger() is not None
    handle.delete()
    assert not Schedule.objects.filter(pk="damaged").exists()


@pytest.mark.postgres
@pytest.mark.parametrize("column", ["next_fire_at", "next_nominal_at"])
def test_describe_names_a_next_fire_time_python_cannot_hold_and_update_repairs_it(column):
    handle = _damaged_schedule(column)
    with pytest.raises(weft.UnusableScheduleError) as caught:  # before: DataError
        handle.describe()
    assert (caught.value.schedule_id, caught.value.column) == ("damaged", column)
    assert "holds a time Python cannot represent" in str(caught.value)
    handle.update(args=["repaired"])  # a row whose next fire time cannot be read is planned again from now
    assert len(handle.describe()["next_fire_times"]) == 5


@pytest.mark.postgres
@pytest.mark.parametrize("column", MOMENTS)
def test_the_firing_pass_fires_the_others_and_backs_off_from_it_with_its_reason(weft_clock, caplog, column):
    from types import SimpleNamespace

    from weft_django.conf import get_settings

    caplog.set_level(logging.WARNING, logger="weft_django")
    weft.schedule("tests.scheduled_run", id="good", every=60, overlap="allow")
    weft.schedule("tests.scheduled_run", id="damaged", every=60, overlap="allow")
    due = weft_clock.now() - timedelta(seconds=1)
    Schedule.objects.update(next_fire_at=due, next_nominal_at=due)  # both due
    damage = "'-infinity'" if column == "next_fire_at" else TOO_LATE  # still due: before every other time
    _sql(f"UPDATE weft_django_schedule SET {column} = {damage} WHERE id = 'damaged'")
    chore = firing.ScheduleFiring()
    chore.run(SimpleNamespace(using="default", settings=get_settings()), weft_clock.now())
    fired = set(Workflow.objects.values_list("schedule_id", flat=True))
    if column in ("next_fire_at", "next_nominal_at"):  # unusable: backed off, with the column named
        assert fired == {"good"}, fired
        assert "damaged" in chore._failed
        assert f"its {column} holds a time Python cannot represent" in caplog.text, caplog.text
    else:  # a timestamp the firing does not need: it fires (and its last_fired_at is written again)
        assert fired == {"good", "damaged"}, fired
