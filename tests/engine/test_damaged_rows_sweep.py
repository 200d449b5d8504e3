"""A row damaged in one column by raw SQL (a hand edit, a bad migration) stops its own workflow, never
the engine (docs/concepts.md: a row that cannot be decoded stops that run, never the engine).

Each case starts a workflow, parks it where the damaged row matters, damages one column with raw SQL,
starts a healthy workflow beside it and runs an engine: the healthy one completes, the damaged one is
stuck with the reason, and the engine is not kept busy by it.
"""

from __future__ import annotations

import pytest
from django.db import connection

import weft_django as weft
from tests.testapp.workflows import add
from weft_django.models import Engine, Step, Timer, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


ACTIVITY_THEN_SIGNAL = "tests.damaged_rows.activity_then_signal"


@weft.workflow(name=ACTIVITY_THEN_SIGNAL)
def activity_then_signal(ctx):
    total = yield ctx.run(add, 1, 2)
    extra = yield ctx.wait_for_signal("go")
    return [total, extra]


def _sql(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


_W, _S, _T = Workflow._meta.db_table, Step._meta.db_table, Timer._meta.db_table

# (case, workflow, args, the damage); the workflow is parked first (a timer armed, step 0 recorded)
PAST_YEAR_9999 = [
    ("workflow.started_at infinity", "tests.sleeper", [3600], f"UPDATE {_W} SET started_at = 'infinity'"),
    (
        "workflow.execution_deadline infinity",
        "tests.sleeper",
        [3600],
        f"UPDATE {_W} SET execution_deadline = 'infinity'",
    ),
    (
        "workflow.execution_deadline -infinity",
        "tests.sleeper",
        [3600],
        f"UPDATE {_W} SET execution_deadline = '-infinity'",
    ),
    ("timer.fire_at infinity", "tests.sleeper", [3600], f"UPDATE {_T} SET fire_at = 'infinity'"),
    ("timer.fire_at year 10000", "tests.sleeper", [3600], f"UPDATE {_T} SET fire_at = '10000-01-01T00:00:00Z'"),
    ("timer.fire_at -infinity", "tests.sleeper", [3600], f"UPDATE {_T} SET fire_at = '-infinity'"),
    ("step.started_at infinity", ACTIVITY_THEN_SIGNAL, [], f"UPDATE {_S} SET started_at = 'infinity'"),
    ("step.completed_at infinity", ACTIVITY_THEN_SIGNAL, [], f"UPDATE {_S} SET completed_at = 'infinity'"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(("case", "workflow", "args", "damage"), PAST_YEAR_9999, ids=[c[0] for c in PAST_YEAR_9999])
def test_a_timestamp_python_cannot_hold_makes_only_its_workflow_stuck(
    weft_run_until_idle, case, workflow, args, damage
):
    """PostgreSQL keeps timestamps past year 9999 (and +-infinity) that psycopg cannot convert: its
    DataError while reading the load's result is a row that cannot be converted, not a database failure
    that reloads every pass for ever."""
    bad = weft.start(workflow, args=args, id="bad")
    weft_run_until_idle(timeout=10)  # parked: a timer armed, or step 0 recorded and a signal wait
    _sql(f"{damage} WHERE {'id' if damage.startswith(f'UPDATE {_W} ') else 'workflow_id'} = 'bad'")
    if workflow == ACTIVITY_THEN_SIGNAL:
        bad.signal("go", 1)  # runnable again: its steps are read again
    good = weft.start("tests.sum", args=[2, 3], id="good")
    weft_run_until_idle(timeout=15)  # before the fix: TimeoutError, still busy (every pass failed)
    assert good.result(timeout=5) == {"total": 5}
    stuck = Workflow.objects.values_list("status", "stuck_error").get(pk="bad")
    assert stuck[0] == "running" and stuck[1] is not None, stuck
    assert stuck[1]["type"] == "EngineInternalError"
    assert "cannot be read" in stuck[1]["message"] and "year" in stuck[1]["message"], stuck[1]["message"]


@pytest.mark.postgres
@pytest.mark.parametrize("column", ["heartbeat_at", "started_at", "stopped_at"])
def test_an_engine_restarted_under_its_id_over_a_damaged_engine_row_starts(weft_run_until_idle, column):
    """An engine registers by its id (weft_engine --engine-id, stable in a StatefulSet): its earlier
    row, damaged in a column psycopg cannot convert, is overwritten, not read first (the registration's
    read raised DataError, so that engine could never start again)."""
    weft_run_until_idle(timeout=10, engine_id="stable-id")
    _sql(f"UPDATE {Engine._meta.db_table} SET {column} = 'infinity' WHERE id = 'stable-id'")
    good = weft.start("tests.sum", args=[2, 3], id="good")
    weft_run_until_idle(timeout=15, engine_id="stable-id")  # before the fix: DataError: timestamp too large
    assert good.result(timeout=5) == {"total": 5}
    assert Engine.objects.filter(pk="stable-id", stopped_at__isnull=False).exists()


@pytest.mark.postgres
def test_the_admin_list_and_describe_answer_for_a_run_with_a_timestamp_past_year_9999(admin_client):
    """The admin's workflow list, describe() and `weft list` read the timestamps through store/moments.py:
    the row psycopg cannot convert shows, its column marked (tests/admin/test_unreadable_timestamps.py)."""
    weft.start("tests.signals", id="bad")
    weft.start("tests.signals", id="ok")
    _sql(f"UPDATE {_W} SET started_at = 'infinity' WHERE id = 'bad'")
    assert admin_client.get("/admin/weft_django/workflow/").status_code == 200
    described = weft.get_handle("bad").describe()
    assert described["started_at"] is None and described["unreadable"] == {"started_at": "infinity"}


# SQLite keeps any value: Django reads a number or text of another shape in a datetime column as None
# (a malformed date raises ValueError, which the load already treats per workflow).
READ_AS_NONE = [
    ("timer.fire_at 12345", "tests.sleeper", [3600], f"UPDATE {_T} SET fire_at = 12345"),
    ("timer.fire_at text", "tests.sleeper", [3600], f"UPDATE {_T} SET fire_at = 'soon'"),
    ("step.started_at 12345", ACTIVITY_THEN_SIGNAL, [], f"UPDATE {_S} SET started_at = 12345"),
]


@pytest.mark.sqlite
@pytest.mark.parametrize(("case", "workflow", "args", "damage"), READ_AS_NONE, ids=[c[0] for c in READ_AS_NONE])
def test_a_required_timestamp_sqlite_reads_as_none_makes_only_its_workflow_stuck(
    weft_run_until_idle, case, workflow, args, damage
):
    """A timer whose fire_at read as None went into the engine's timer heap: every later pass failed
    comparing it with the clock (TypeError), so no workflow of that engine ran again."""
    bad = weft.start(workflow, args=args, id="bad")
    weft_run_until_idle(timeout=10)
    _sql(f"{damage} WHERE workflow_id = 'bad'")
    if workflow == ACTIVITY_THEN_SIGNAL:
        bad.signal("go", 1)
    good = weft.start("tests.sum", args=[2, 3], id="good")
    weft_run_until_idle(timeout=15)  # before the fix: TimeoutError, still busy (every pass failed)
    assert good.result(timeout=5) == {"total": 5}
    stuck = Workflow.objects.values_list("status", "stuck_error").get(pk="bad")
    assert stuck[0] == "running" and stuck[1] is not None, stuck
    assert "cannot be read" in stuck[1]["message"], stuck[1]["message"]
