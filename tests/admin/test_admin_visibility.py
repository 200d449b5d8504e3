"""The admin's visibility tools (issue 19): attribute, schedule and parent filters, KEY=VALUE search,
the fork action and the bulk page with its confirmation count."""

from __future__ import annotations

import pytest
from django.apps import apps

import weft_django as weft
from tests.admin.test_admin import ADMIN
from tests.testapp import visibility_workflows
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

CHANGELIST = f"{ADMIN}/workflow/"
BULK = f"{ADMIN}/workflow/bulk/"


def listed(response) -> set[str]:
    return {row.pk for row in response.context["cl"].result_list}


def snapshot() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


@pytest.fixture
def orders(db):
    a = weft.start("visibility.order", args=["a", 1.0], id="o-a", attributes={"customer": "acme", "items": 2})
    b = weft.start("visibility.order", args=["b", 1.0], id="o-b", attributes={"customer": "beta", "items": 9})
    Workflow.objects.filter(pk="o-b").update(parent_id="o-a", schedule_id="nightly")
    return a.id, b.id


def test_filters_and_search(admin_client, orders):
    assert listed(admin_client.get(CHANGELIST, {"attribute": "customer=acme"})) == {"o-a"}
    assert listed(admin_client.get(CHANGELIST, {"attribute": "items__gte=5"})) == {"o-b"}
    assert listed(admin_client.get(CHANGELIST, {"attribute": "tags__exists=true"})) == set()
    assert listed(admin_client.get(CHANGELIST, {"schedule": "nightly"})) == {"o-b"}
    assert listed(admin_client.get(CHANGELIST, {"schedule": "-"})) == {"o-a"}
    assert listed(admin_client.get(CHANGELIST, {"parent": "o-a"})) == {"o-b"}
    assert listed(admin_client.get(CHANGELIST, {"parent": "-"})) == {"o-a"}
    assert listed(admin_client.get(CHANGELIST, {"q": "customer=beta status=running"})) == {"o-b"}
    assert listed(admin_client.get(CHANGELIST, {"q": "o-a"})) == {"o-a"}
    page = admin_client.get(CHANGELIST)
    assert b"customer is set" in page.content and b"Bulk by filter" in page.content
    response = admin_client.get(CHANGELIST, {"q": "nosuch=1"}, follow=True)
    assert listed(response) == {"o-a", "o-b"}  # a bad filter is reported, not applied
    assert any("no registered workflow declares" in str(m) for m in response.context["messages"])


def test_bulk_page_counts_confirms_and_refuses_a_stale_count(admin_client, orders):
    counted = admin_client.post(BULK, {"operation": "cancel", "where": "customer=acme", "recount": "1"})
    assert counted.status_code == 200 and counted.context["count"] == 1
    weft.start("visibility.order", args=["c", 1.0], id="o-c", attributes={"customer": "acme"})
    before = snapshot()
    stale = admin_client.post(BULK, {"operation": "cancel", "where": "customer=acme", "expected_count": "1"})
    assert stale.status_code == 200 and stale.context["count"] == 2
    assert "now selects 2" in stale.content.decode()
    assert snapshot() == before and set(Workflow.objects.values_list("status", flat=True)) == {"running"}
    done = admin_client.post(
        BULK, {"operation": "cancel", "where": "customer=acme", "expected_count": "2", "reason": "r"}, follow=True
    )
    assert any("Bulk cancel: 2 of 2" in str(m) for m in done.context["messages"])
    assert set(Workflow.objects.filter(status="cancelled").values_list("pk", flat=True)) == {"o-a", "o-c"}
    bad = admin_client.post(BULK, {"operation": "cancel", "where": "customer", "recount": "1"})
    assert "KEY=VALUE" in bad.content.decode()


def test_bulk_needs_the_operations_permission(client, django_user_model, orders):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflow"))
    client.force_login(user)
    assert client.get(BULK).status_code == 200
    response = client.post(BULK, {"operation": "cancel", "where": "customer=acme", "recount": "1"})
    assert response.status_code == 403


@pytest.mark.django_db(transaction=True)
def test_fork_action(admin_client):
    visibility_workflows.FORK_VERSION["value"] = "v1"
    weft.start("visibility.failing", args=["adm"], id="adm-src")
    run_until_idle()
    try:
        visibility_workflows.FORK_VERSION["value"] = "v2"
        form = admin_client.post(CHANGELIST, {"action": "fork_workflow", "_selected_action": ["adm-src"]})
        assert form.status_code == 200 and b"from_step" in form.content
        bad = admin_client.post(
            CHANGELIST, {"action": "fork_workflow", "_selected_action": ["adm-src"], "apply": "1", "from_step": "9"}
        )
        assert b"InvalidForkError" in bad.content
        response = admin_client.post(
            CHANGELIST,
            {
                "action": "fork_workflow",
                "_selected_action": ["adm-src"],
                "apply": "1",
                "from_step": "1",
                "new_id": "adm-f",
            },
            follow=True,
        )
        assert any('"adm-f"' in str(m) for m in response.context["messages"])
        run_until_idle()
        assert weft.get_handle("adm-f").result(timeout="5s") == "a:v1"
    finally:
        visibility_workflows.FORK_VERSION["value"] = "v1"


def test_change_page_shows_the_search_attributes(admin_client, orders):
    page = admin_client.get(f"{CHANGELIST}o-a/change/").content.decode()
    assert "Search attributes" in page
    assert "<code>customer</code> = &#x27;acme&#x27;" in page
    assert "<code>items</code> = 2" in page
    bare = weft.start("visibility.order", args=["c", 1.0], id="o-c")
    assert "Search attributes" in admin_client.get(f"{CHANGELIST}{bare.id}/change/").content.decode()
