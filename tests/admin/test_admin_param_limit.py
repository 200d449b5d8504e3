"""SQLite: the workflow list's actions with "Select all" over more rows than SQLite binds in one statement
(its limit on parameters, lowered to 999 for speed: tests/param_limit.py). Every id selected went into one
``pk__in`` (Django does not split it on SQLite): "too many SQL variables", a server error, after a cancel
had already been applied to every run. They go in chunks (``store.backend.Backend.chunks``)."""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.admin.test_admin_actions import CHANGELIST, messages_of
from tests.param_limit import OVER, lowered_param_limit
from weft_django.models import Workflow

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def many():
    weft.start_many([weft.StartRequest("admin_tests.waits", id=f"m-{i:05}") for i in range(OVER)])
    with lowered_param_limit():
        yield


def select_all(action: str, **extra) -> dict:
    return {"action": action, "select_across": "1", "_selected_action": ["m-00000"], "index": "0", **extra}


def test_cancel_of_every_selected_run_over_the_limit(admin_client, many):
    response = admin_client.post(CHANGELIST, select_all("cancel_workflows"), follow=True)
    assert response.status_code == 200
    assert messages_of(response)[0].startswith(f"Cancelled {OVER} workflows: ")
    assert set(Workflow.objects.values_list("status", flat=True)) == {"cancelled"}


def test_purge_of_every_selected_run_over_the_limit(admin_client, many):
    Workflow.objects.filter(pk__lt="m-00500").update(status="completed", result="1")
    Workflow.objects.filter(pk__gte="m-00500").update(status="completed", result="1")
    response = admin_client.post(CHANGELIST, select_all("purge_workflows"))
    assert response.status_code == 200
    assert len(response.context["purgeable"]) == OVER
    response = admin_client.post(CHANGELIST, select_all("purge_workflows", post="yes"), follow=True)
    assert messages_of(response) == [f"Purged {OVER} terminal workflows."]
    assert not Workflow.objects.exists()
