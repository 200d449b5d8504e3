"""A search attribute's ``time_value`` or a claim's ``expires_at`` that a hand edit put out of Python's
reach (PostgreSQL: past year 9999, before year 1, 'infinity'; SQLite: text that is no real date) no
longer fails the whole read: ``weft.list_workflows``, ``weft list --where``, ``weft list``, the admin's
workflow list (its claim-expiry column, its attribute filter) and change page (its attributes) answer,
the damaged value shown "unreadable timestamp (<stored text>)" (None with an "unreadable" entry in the
API and JSON), the other rows as they are (store/moments.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

import weft_django as weft
from weft_django.models import WorkflowAttribute, WorkflowClaim

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = "/admin/weft_django"
UNREADABLE = "unreadable timestamp"  # store.moments.UNREADABLE
POSTGRESQL = ["infinity", "-infinity", "10000-01-01 00:00:00+00", "0001-01-01 00:00:00+00 BC"]
SQLITE = ["0000-01-01 00:00:00", "2024-13-01 00:00:00", "2024-02-30 10:00:00"]
DAMAGE = SQLITE if connection.vendor == "sqlite" else POSTGRESQL
PLACED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _sql(statement: str, params: list[object]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _two_orders(value: str) -> None:
    """Orders "bad" and "ok" with a placed_at attribute; "bad"'s time_value holds ``value``."""
    for workflow_id in ("bad", "ok"):
        weft.start("visibility.order", args=["acme", 5.0], id=workflow_id, attributes={"placed_at": PLACED})
    _sql(f"UPDATE {WorkflowAttribute._meta.db_table} SET time_value = %s WHERE workflow_id = 'bad'", [value])


# -- item 6: WorkflowAttribute.time_value -------------------------------------------------------------
@pytest.mark.parametrize("value", DAMAGE)
def test_list_workflows_shows_an_attribute_time_it_cannot_read_marked(value):
    _two_orders(value)
    page = {summary.id: summary for summary in weft.list_workflows()}  # before: DataError / ValueError
    assert page["ok"].attributes["placed_at"] == PLACED and page["ok"].unreadable == {}
    assert page["bad"].attributes["placed_at"] is None
    assert page["bad"].unreadable == {"attributes.placed_at": value}
    filtered = weft.list_workflows(attributes={"placed_at__exists": True})
    assert sorted(summary.id for summary in filtered) == ["bad", "ok"]


@pytest.mark.parametrize("value", DAMAGE)
def test_weft_list_where_answers(value):
    _two_orders(value)
    rows = {
        row["id"]: row for row in json.loads(_cli("list", "--where", "placed_at__exists=true", "--json"))["workflows"]
    }
    assert rows["bad"]["attributes"]["placed_at"] is None  # before: DataError / ValueError
    assert rows["bad"]["unreadable"] == {"attributes.placed_at": value} and "unreadable" not in rows["ok"]
    text = _cli("list", "--where", "placed_at__exists=true")
    assert "bad" in text and "ok" in text and f"{UNREADABLE} ({value})" in text, text


@pytest.mark.parametrize("value", DAMAGE)
def test_the_admin_shows_an_attribute_time_it_cannot_read_marked(admin_client, value):
    _two_orders(value)
    change = admin_client.get(f"{ADMIN}/workflow/bad/change/")  # before: DataError / ValueError
    assert change.status_code == 200 and f"{UNREADABLE} ({value})" in change.content.decode()
    assert admin_client.get(f"{ADMIN}/workflow/ok/change/").status_code == 200
    for query in (
        "attribute=placed_at__exists%3Dtrue",
        "attribute=placed_at__gte%3D2026-01-01T00:00Z",
        "q=placed_at__exists%3Dtrue",
    ):
        listed = admin_client.get(f"{ADMIN}/workflow/?{query}")
        assert listed.status_code == 200, query
        assert "/workflow/ok/change/" in listed.content.decode(), query


# -- item 7: a claim's expires_at -------------------------------------------------------------------------
def _held_until(value: str) -> None:
    weft.start("tests.signals", id="bad")
    weft.start("tests.signals", id="ok")
    _sql(
        f"UPDATE {WorkflowClaim._meta.db_table} SET engine_id = 'some-engine', expires_at = %s "
        "WHERE workflow_id = 'bad'",
        [value],
    )


@pytest.mark.parametrize("value", DAMAGE)
def test_the_admin_workflow_list_shows_a_claim_expiry_it_cannot_read_marked(admin_client, value):
    _held_until(value)
    listed = admin_client.get(f"{ADMIN}/workflow/")  # before: DataError / ValueError
    assert listed.status_code == 200
    page = listed.content.decode()
    assert "/workflow/bad/change/" in page and "/workflow/ok/change/" in page
    assert f"{UNREADABLE} ({value})" in page
    for query in ("ownership=owned", "ownership=lapsed", "o=6"):  # the filters, and ordering by the expiry
        assert admin_client.get(f"{ADMIN}/workflow/?{query}").status_code == 200, query
    assert admin_client.get(f"{ADMIN}/workflow/bad/change/").status_code == 200
    claims = admin_client.get(f"{ADMIN}/workflowclaim/")
    assert claims.status_code == 200 and f"{UNREADABLE} ({value})" in claims.content.decode()


@pytest.mark.parametrize("value", DAMAGE)
def test_weft_list_shows_a_claim_expiry_it_cannot_read_marked(value):
    _held_until(value)
    text = _cli("list")  # before: DataError / ValueError
    assert "bad" in text and "ok" in text and f"{UNREADABLE} ({value})" in text, text
    rows = {row["id"]: row for row in json.loads(_cli("list", "--json"))}
    assert rows["bad"]["claim_expires_at"] is None and rows["bad"]["unreadable"] == {"claim_expires_at": value}
    assert weft.get_handle("bad").describe()["unreadable"] == {"claim_expires_at": value}
