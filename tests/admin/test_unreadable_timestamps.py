"""One run row whose timestamp a hand edit put out of Python's reach never takes a listing down.

PostgreSQL keeps timestamps before year 1, past year 9999 and +-infinity; psycopg raises DataError
converting one, which failed the whole read: `weft list`, `weft describe`, `weft queues`, `weft
export`, `weft replay`, `list_workflows`, the admin's workflow list, change page, terminal-states
and queues pages. SQLite keeps any text: Django's conversion of a malformed date (a year 0, a month
13, a February 30) raised ValueError the same way, and a number in created_at failed the admin's
date hierarchy. Each of these now answers: the other rows read normally, the damaged column is
shown "unreadable timestamp (<stored text>)" (None with an "unreadable" entry in JSON and the API),
and `weft describe` says what is wrong (store/moments.py).
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

import weft_django as weft
from weft_django.models import Step, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = "/admin/weft_django"
UNREADABLE = "unreadable timestamp"  # store.moments.UNREADABLE
# What a hand edit can leave that the driver cannot convert. PostgreSQL: text as it prints it back.
POSTGRESQL = ["infinity", "-infinity", "10000-01-01 00:00:00+00", "0001-01-01 00:00:00+00 BC"]
SQLITE = ["0000-01-01 00:00:00", "2024-13-01 00:00:00", "2024-02-30 10:00:00", 12345]
DAMAGE = SQLITE if connection.vendor == "sqlite" else POSTGRESQL
COLUMNS = ["created_at", "started_at", "finished_at"]


def _damage(workflow_id: str, value: object, *columns: str) -> None:
    assignments = ", ".join(f"{column} = %s" for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Workflow._meta.db_table} SET {assignments} WHERE id = %s", [*[value] * len(columns), workflow_id]
        )


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _two_runs(column: str, value: object) -> str:
    """A sound run "ok" and a run "bad" whose ``column`` holds ``value``; returns the stored text."""
    weft.start("tests.signals", id="bad")
    weft.start("tests.signals", id="ok")
    _damage("bad", value, column)
    return str(value)


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("value", DAMAGE)
def test_weft_list_and_describe_answer_with_the_damaged_column_marked(column, value):
    stored = _two_runs(column, value)
    listed = _cli("list")  # before the fix: DataError / ValueError for the whole listing
    assert "ok" in listed and "bad" in listed, listed
    if column == "created_at":
        assert f"{UNREADABLE} ({stored})" in listed, listed
    rows = {row["id"]: row for row in json.loads(_cli("list", "--json"))}
    assert rows["bad"][column] is None and rows["bad"]["unreadable"] == {column: stored}
    assert "unreadable" not in rows["ok"] and rows["ok"]["created_at"] is not None
    described = weft.get_handle("bad").describe()
    assert described[column] is None and described["unreadable"] == {column: stored}
    assert "unreadable" not in weft.get_handle("ok").describe()
    text = _cli("describe", "bad")
    assert f"{UNREADABLE} ({stored})" in text and "damaged" in text and "Python cannot represent" in text, text
    assert json.loads(_cli("describe", "bad", "--json"))["unreadable"] == {column: stored}


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("value", DAMAGE)
def test_list_workflows_pages_past_a_run_whose_timestamp_cannot_be_read(column, value):
    weft.start("tests.signals", id="a-first")
    stored = _two_runs(column, value)
    seen, cursor = [], None
    while True:  # one run per page: the cursor after the damaged run, whatever its created_at
        page = weft.list_workflows(limit=1, cursor=cursor)
        seen += list(page)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(summary.id for summary in seen) == ["a-first", "bad", "ok"]
    bad = next(summary for summary in seen if summary.id == "bad")
    assert getattr(bad, column) is None and bad.unreadable == {column: stored}
    assert all(summary.unreadable == {} for summary in seen if summary.id != "bad")
    where = json.loads(_cli("list", "--where", "status=running", "--json"))["workflows"]
    assert {row["id"]: row.get("unreadable") for row in where} == {"a-first": None, "bad": {column: stored}, "ok": None}


@pytest.mark.parametrize("value", DAMAGE)
def test_weft_queues_and_the_queues_page_answer(admin_client, settings, value):
    settings.WEFT = {**settings.WEFT, "QUEUES": {"q": {"concurrency": 1}}}
    weft.start("tests.signals", id="waits", queue="q")
    weft.start("tests.signals", id="ran", queue="q")
    _damage("waits", value, "created_at")  # the oldest waiting start
    _damage("ran", value, "admitted_at")  # the last admission
    report = json.loads(_cli("queues", "--json"))  # before the fix: DataError / ValueError
    (queue,) = report["queues"]
    assert queue["waiting"] == 1 and queue["unreadable"] == {"oldest_waiting": str(value), "last_admitted": str(value)}
    assert "q" in _cli("queues")
    page = admin_client.get(f"{ADMIN}/workflow/queues/")
    assert page.status_code == 200 and f"{UNREADABLE} ({value})" in page.content.decode()


@pytest.mark.parametrize("value", DAMAGE)
def test_export_names_the_damaged_column(value):
    _two_runs("started_at", value)
    with pytest.raises(CommandError, match=r"'bad' cannot be exported: started_at: .*Repair the row"):
        _cli("export", "bad")  # before the fix: DataError / ValueError, a traceback
    assert json.loads(_cli("export", "ok"))["workflow_id"] == "ok"


@pytest.mark.parametrize("value", DAMAGE)
def test_the_replay_check_reports_the_damaged_run_and_replays_the_others(value):
    _two_runs("started_at", value)
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 2 replayed run"):  # before the fix: DataError / ValueError
        call_command("weft_replay", "--json", stdout=out)
    (failed,) = json.loads(out.getvalue())["failed"]
    assert failed["workflow_id"] == "bad" and failed["error_type"] == "EngineInternalError"
    assert "cannot be read" in failed["message"] and str(value) in failed["message"]


ADMIN_COLUMNS = ["created_at", "updated_at", "started_at", "execution_deadline", "finished_at"]


@pytest.mark.parametrize("column", ADMIN_COLUMNS)
@pytest.mark.parametrize("value", DAMAGE)
def test_the_admin_workflow_list_and_change_page_answer_with_the_column_marked(admin_client, column, value):
    stored = _two_runs(column, value)
    marked = f"{UNREADABLE} ({stored})"
    changelist = admin_client.get(f"{ADMIN}/workflow/")  # before the fix: DataError / ValueError / TypeError
    assert changelist.status_code == 200
    page = changelist.content.decode()
    assert "/workflow/bad/change/" in page and "/workflow/ok/change/" in page
    if column in ("created_at", "updated_at"):
        assert marked in page
    search = admin_client.get(f"{ADMIN}/workflow/?q=bad")
    assert search.status_code == 200 and "/workflow/bad/change/" in search.content.decode()
    change = admin_client.get(f"{ADMIN}/workflow/bad/change/")
    assert change.status_code == 200 and marked in change.content.decode()


@pytest.mark.parametrize("value", DAMAGE)
def test_a_parents_change_page_lists_a_child_whose_created_at_cannot_be_read(admin_client, value):
    weft.start("tests.signals", id="parent")
    weft.start("tests.signals", id="child")
    Workflow.objects.filter(pk="child").update(parent_id="parent")
    _damage("child", value, "created_at")
    change = admin_client.get(f"{ADMIN}/workflow/parent/change/")  # before the fix: DataError / ValueError
    assert change.status_code == 200
    assert "/workflow/child/change/" in change.content.decode()
    assert f"{UNREADABLE} ({value})" in change.content.decode()


@pytest.mark.parametrize("value", DAMAGE)
def test_the_terminal_states_page_answers_for_a_failure_whose_finished_at_cannot_be_read(admin_client, value):
    for workflow_id in ("bad", "ok"):
        weft.start("tests.signals", id=workflow_id)
    Workflow.objects.update(status="failed", error={"type": "E", "message": "m"}, finished_at=timezone.now())
    _damage("bad", value, "finished_at")
    terminal = admin_client.get(f"{ADMIN}/workflow/terminal/")  # before the fix: DataError / ValueError
    assert terminal.status_code == 200
    page = terminal.content.decode()
    assert "/workflow/bad/change/" in page and "/workflow/ok/change/" in page
    assert f"{UNREADABLE} ({value})" in page


STEP_DAMAGE = [*DAMAGE, "soon"] if connection.vendor == "sqlite" else DAMAGE


@pytest.mark.parametrize("value", STEP_DAMAGE)
def test_the_replay_check_reports_a_run_whose_step_cannot_be_read_and_replays_the_others(weft_run_until_idle, value):
    """A step's started_at the driver cannot convert failed the page's history read (on SQLite one Django
    reads as None passed for a time): the whole check stopped, or replayed a run an engine makes stuck."""
    for workflow_id in ("bad", "ok"):
        weft.start("tests.sum", args=[2, 3], id=workflow_id)
    weft_run_until_idle(timeout=15)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Step._meta.db_table} SET started_at = %s WHERE workflow_id = 'bad'", [value])
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 2 replayed run"):  # before: DataError / ValueError / DID NOT RAISE
        call_command("weft_replay", "--json", stdout=out)
    (failed,) = json.loads(out.getvalue())["failed"]
    assert failed["workflow_id"] == "bad" and "cannot be read" in failed["message"], failed
    with pytest.raises(CommandError, match="'bad' cannot be exported: history"):
        _cli("export", "bad")
