"""An engine row, a claim or a schedule whose timestamp a hand edit put out of Python's reach
(PostgreSQL: past year 9999, before year 1, 'infinity'; SQLite: text that is no real date) no longer
fails the whole read: the admin's engine list and change page, its ownership page, ``weft engines``,
``weft claims``, ``weft doctor``, the admin's schedule list and change page and ``weft schedules``
answer, the damaged value shown "unreadable timestamp (<stored text>)" (None with an "unreadable"
entry in JSON), the other rows as they are (store/moments.py). An engine's state is decided on its
heartbeat as stored, as the engines decide it (store/liveness.py): 'infinity' and '-infinity' are both
dead (a heartbeat is evidence of life only within the TTL of the clock, either side).
"""

from __future__ import annotations

import contextlib
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import weft_django as weft
from weft_django.models import Engine, Schedule, WorkflowClaim

from .test_unreadable_attribute_and_claim import ADMIN, DAMAGE, UNREADABLE  # the same damaged values

pytestmark = pytest.mark.django_db(transaction=True)

NOW = "now()" if connection.vendor == "postgresql" else "datetime('now')"


def _sql(statement: str, params: list[object] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _doctor() -> dict[str, dict[str, object]]:
    out = StringIO()
    with contextlib.suppress(CommandError):  # unhealthy: a report all the same
        call_command("weft", "doctor", "--json", stdout=out, stderr=StringIO())
    return {check["check"]: check for check in json.loads(out.getvalue())["checks"]}


# -- the Engine rows ----------------------------------------------------------------------------------
def _two_engines(column: str, value: str) -> None:
    """Engines "bad" and "good" (the run "w" held by "bad"); "bad"'s ``column`` holds ``value``."""
    for engine_id in ("bad", "good"):
        _sql(
            f"INSERT INTO {Engine._meta.db_table} (id, host, pid, mode, started_at, heartbeat_at, stopped_at) "
            f"VALUES (%s, 'elsewhere', 1, 'workflow-lease', {NOW}, {NOW}, NULL)",
            [engine_id],
        )
    weft.start("tests.signals", id="w")
    _sql(f"UPDATE {WorkflowClaim._meta.db_table} SET engine_id = 'bad' WHERE workflow_id = 'w'")
    _sql(f"UPDATE {Engine._meta.db_table} SET {column} = %s WHERE id = 'bad'", [value])


@pytest.mark.parametrize("column", ["heartbeat_at", "started_at", "stopped_at"])
@pytest.mark.parametrize("value", DAMAGE)
def test_the_admin_engine_pages_and_the_ownership_page_show_an_engine_time_they_cannot_read(
    admin_client, column, value
):
    _two_engines(column, value)
    marked = f"{UNREADABLE} ({value})"
    for url in (f"{ADMIN}/engine/", f"{ADMIN}/engine/?o=7", f"{ADMIN}/engine/bad/change/"):
        page = admin_client.get(url)  # before: DataError / ValueError
        assert page.status_code == 200 and marked in page.content.decode(), url
    assert admin_client.get(f"{ADMIN}/engine/good/change/").status_code == 200
    ownership = admin_client.get(f"{ADMIN}/workflow/ownership/")  # before: DataError / ValueError
    assert ownership.status_code == 200
    page = ownership.content.decode()
    assert "<code>good</code>" in page and "<code>bad</code>" in page
    if column != "stopped_at":  # the stopped time is not a column of the page
        assert marked in page


@pytest.mark.parametrize("column", ["heartbeat_at", "started_at", "stopped_at"])
@pytest.mark.parametrize("value", DAMAGE)
def test_weft_engines_claims_and_doctor_answer_for_an_engine_time_they_cannot_read(column, value):
    _two_engines(column, value)
    rows = {row["id"]: row for row in json.loads(_cli("engines", "--json"))}  # before: DataError / ValueError
    assert rows["bad"][column] is None and rows["bad"]["unreadable"] == {column: value}
    assert "unreadable" not in rows["good"] and rows["good"]["state"] == "alive"
    if column == "stopped_at":
        assert rows["bad"]["state"] == "stopped"
    text = _cli("engines")
    assert "good" in text and "bad" in text
    if column != "stopped_at":
        assert f"{UNREADABLE} ({value})" in text, text
    (claim,) = json.loads(_cli("claims", "--json"))  # its holder's heartbeat: before, DataError / ValueError
    assert claim["workflow_id"] == "w" and claim["engine_id"] == "bad"
    assert "w" in _cli("claims")
    dead = _doctor()["dead engines"]  # before: DataError for a heartbeat before year 1
    if column == "heartbeat_at" and rows["bad"]["state"] == "dead":
        assert any(f"{UNREADABLE} ({value})" in detail for detail in dead["details"]), dead  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", DAMAGE)
def test_an_engine_heartbeat_it_cannot_read_has_the_state_the_engines_give_it(value):
    """The state shown is the engines' own reading of the stored heartbeat (store/liveness.py)."""
    from datetime import timedelta

    from weft_django.store.engines import other_live_engines

    _two_engines("heartbeat_at", value)
    live = "bad" in other_live_engines("good", within=timedelta(seconds=30), using="default")
    (bad,) = (row for row in json.loads(_cli("engines", "--json")) if row["id"] == "bad")
    assert bad["state"] == ("alive" if live else "dead") and bad["heartbeat_age_seconds"] is None


# -- a claim's times in the ownership views ---------------------------------------------------------
@pytest.mark.parametrize("column", ["expires_at", "claimed_at"])
@pytest.mark.parametrize("value", DAMAGE)
def test_weft_claims_the_ownership_page_and_doctor_show_a_claim_time_they_cannot_read(admin_client, column, value):
    weft.start("tests.signals", id="bad")
    weft.start("tests.signals", id="ok")
    _sql(
        f"UPDATE {WorkflowClaim._meta.db_table} SET engine_id = 'gone', {column} = %s WHERE workflow_id = 'bad'",
        [value],
    )
    rows = {row["workflow_id"]: row for row in json.loads(_cli("claims", "--json"))}  # before: DataError
    assert rows["bad"][column] is None and rows["bad"]["unreadable"] == {column: value}
    if column == "expires_at":
        assert f"{UNREADABLE} ({value})" in _cli("claims")
    ownership = admin_client.get(f"{ADMIN}/workflow/ownership/")  # before: DataError / ValueError
    assert ownership.status_code == 200 and f"{UNREADABLE} ({value})" in ownership.content.decode()
    lapsed = _doctor()["lapsed claims"]  # before: DataError / ValueError (an expiry it cannot read)
    if lapsed["level"] == "error" and column == "expires_at":
        assert any(f"{UNREADABLE} ({value})" in detail for detail in lapsed["details"]), lapsed  # type: ignore[attr-defined]


# -- the Schedule rows --------------------------------------------------------------------------------
@pytest.mark.parametrize("column", ["next_fire_at", "next_nominal_at", "last_fired_at", "created_at", "updated_at"])
@pytest.mark.parametrize("value", DAMAGE)
def test_the_schedule_pages_and_weft_schedules_show_a_schedule_time_they_cannot_read(admin_client, column, value):
    for schedule_id in ("bad", "good"):
        weft.schedule("tests.scheduled_run", id=schedule_id, every=60)
    _sql(f"UPDATE {Schedule._meta.db_table} SET {column} = %s WHERE id = 'bad'", [value])
    marked = f"{UNREADABLE} ({value})"
    listed = admin_client.get(f"{ADMIN}/schedule/")  # before: DataError / ValueError
    assert listed.status_code == 200
    page = listed.content.decode()
    assert "/schedule/bad/change/" in page and "/schedule/good/change/" in page
    if column in ("next_fire_at", "last_fired_at"):
        assert marked in page
    change = admin_client.get(f"{ADMIN}/schedule/bad/change/")  # before: DataError / ValueError
    assert change.status_code == 200
    if column in ("next_fire_at", "next_nominal_at"):
        assert "Cannot fire" in change.content.decode()
    elif column in ("created_at", "updated_at"):
        assert marked in change.content.decode()
    described = {row["id"]: row for row in json.loads(_cli("schedules", "--json"))}  # before: DataError
    assert set(described) == {"bad", "good"}
    text = _cli("schedules")
    assert "bad" in text and "good" in text
    if column in ("next_fire_at", "last_fired_at"):
        assert marked in text, text
