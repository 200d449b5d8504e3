"""The changelists with query strings no link makes (typed or edited by hand): a filter value holding
NUL (PostgreSQL refuses it as a parameter), a date-hierarchy day at the end of year 9999, a search
attribute value the database cannot take. Each shows the list (Django's "?e=1" redirect or a message),
never a server error."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.admin.test_admin import ADMIN
from weft_django.models import BufferedSignal

pytestmark = pytest.mark.django_db

WORKFLOWS = f"{ADMIN}/workflow/"
NUL = "a\x00b"


@pytest.fixture
def order(db):
    weft.start("visibility.order", args=["a", 1.0], id="o-1", attributes={"customer": "acme", "items": 2})


@pytest.mark.parametrize(
    ("url", "query"),
    [
        (WORKFLOWS, {"parent": NUL}),
        (WORKFLOWS, {"attribute": f"customer={NUL}"}),
        (WORKFLOWS, {"schedule": NUL}),
        (WORKFLOWS, {"status__exact": NUL}),
        (WORKFLOWS, {"queue": NUL}),
        (WORKFLOWS, {"workflow_type": NUL}),
        (WORKFLOWS, {"id__exact": NUL}),
        (WORKFLOWS, {"created_at__year": "9999", "created_at__month": "12", "created_at__day": "31"}),
        (f"{ADMIN}/timer/", {"kind__exact": NUL}),
        (f"{ADMIN}/bufferedsignal/", {"state__exact": NUL}),
        (f"{ADMIN}/pendingupdate/", {"status__exact": NUL}),
        (f"{ADMIN}/engine/", {"mode__exact": NUL}),
        (f"{ADMIN}/schedule/", {"workflow_type": NUL}),
    ],
)
def test_an_odd_query_string_shows_the_list_not_an_error(admin_client, order, url, query):
    response = admin_client.get(url, query, follow=True)
    assert response.status_code == 200, response.status_code


@pytest.mark.parametrize(
    ("method", "url", "data", "status"),
    [
        ("get", f"{WORKFLOWS}a%00b/change/", {}, 302),  # "doesn't exist", as for any unknown id
        ("get", f"{ADMIN}/workflowclaim/a%00b/change/", {}, 302),
        ("get", f"{ADMIN}/schedule/a%00b/change/", {}, 302),
        ("get", f"{WORKFLOWS}a%00b/act/cancel/", {}, 404),
        ("post", f"{WORKFLOWS}a%00b/act/suspend/", {"run_id": "x"}, 404),
        ("post", f"{ADMIN}/schedule/a%00b/act/pause/", {}, 404),
        ("post", WORKFLOWS, {"action": "cancel_workflows", "_selected_action": ["o-1", NUL]}, 302),
    ],
)
def test_an_id_holding_nul_is_no_such_object_not_an_error(admin_client, order, method, url, data, status):
    response = getattr(admin_client, method)(url, data)
    assert response.status_code == status, response.status_code
    assert weft.get_handle("o-1").status == "running"  # the action was refused as a whole


@pytest.mark.parametrize(
    "query",
    [
        {"attribute": "items=" + "9" * 400},
        {"q": "items__gte=" + "9" * 400},
        {"attribute": "placed_at__gte=9999-12-31T23:00:00-05:00"},
        {"attribute": "tags__in=" + "[" * 5_000},  # JSON deeper than the parser recurses
        {"q": "tags__in=" + "[" * 5_000 + "]" * 5_000},
    ],
)
def test_a_search_attribute_value_the_database_cannot_take_is_reported(admin_client, order, query):
    response = admin_client.get(WORKFLOWS, query, follow=True)
    assert response.status_code == 200
    assert {row.pk for row in response.context["cl"].result_list} == {"o-1"}  # reported, not applied
    assert any("ignored" in str(m) for m in response.context["messages"])


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_signal_payload_nested_too_deep_is_a_form_error(admin_client, order, depth):
    """JSON nested deeper than the parser's recursion (the codec refuses more than 100 levels anyway)."""
    payload = "[" * depth + "]" * depth
    response = admin_client.post(f"{WORKFLOWS}o-1/act/signal/", {"name": "go", "payload": payload})
    assert response.status_code == 200
    assert "payload" in response.context["form"].errors
    assert not BufferedSignal.objects.exists()
