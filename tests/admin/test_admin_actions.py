"""Admin actions: each goes through the public API, checks its permission, and reports successes and
typed refusals with message_user; CSRF is enforced; the timeline shows what the engine recorded."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

import weft_django as weft
from tests.admin.test_admin import ADMIN, hold
from weft_django import codec
from weft_django.models import BufferedSignal, IdempotencyKey, Step, Workflow, WorkflowClaim

CHANGELIST = f"{ADMIN}/workflow/"


def messages_of(response) -> list[str]:
    """The messages a followed response displayed (displaying them consumes them)."""
    return [str(message) for message in response.context["messages"]]


def act(client: Client, action: str, ids: list[str], **extra) -> list[str]:
    response = client.post(CHANGELIST, {"action": action, "_selected_action": ids, "index": "0", **extra}, follow=True)
    assert response.status_code == 200, response.content[:500]
    return messages_of(response)


@pytest.fixture
def waiting(db):
    for i in range(1, 4):
        weft.start("admin_tests.waits", id=f"w{i}")
    return ["w1", "w2", "w3"]


def status(workflow_id: str) -> str:
    return Workflow.objects.values_list("status", flat=True).get(pk=workflow_id)


def test_cancel_reports_successes_and_terminal_refusals_with_plurals(admin_client, waiting):
    hold("w1")
    epoch = WorkflowClaim.objects.get(pk="w1").epoch
    messages = act(admin_client, "cancel_workflows", ["w1", "w2"])
    assert messages == ['Cancelled 2 workflows: "w1", "w2".']
    assert status("w1") == status("w2") == "cancelled"
    claim = WorkflowClaim.objects.get(pk="w1")
    assert claim.engine_id is None and claim.epoch > epoch  # the holder was deposed
    assert Workflow.objects.get(pk="w1").cancel_reason == "cancelled in the Django admin by admin"
    messages = act(admin_client, "cancel_workflows", ["w1", "w2", "w3"])
    assert messages[0] == 'Cancelled 1 workflow: "w3".'
    assert messages[1].startswith("2 workflows were not cancelled (WorkflowTerminalError): ")
    assert 'Workflow "w1" already ended (cancelled)' in messages[1]
    messages = act(admin_client, "cancel_workflows", ["w1"])
    assert messages == [
        '1 workflow was not cancelled (WorkflowTerminalError): Workflow "w1" already ended (cancelled); '
        "there is nothing to cancel."
    ]


def test_suspend_and_resume_report_state_errors(admin_client, waiting):
    assert act(admin_client, "suspend_workflows", ["w1"]) == ['Suspended 1 workflow: "w1".']
    assert status("w1") == "suspended"
    messages = act(admin_client, "suspend_workflows", ["w1", "w2"])
    assert messages[0] == 'Suspended 1 workflow: "w2".'
    assert messages[1].startswith("1 workflow was not suspended (WorkflowStateError): Cannot suspend")
    assert act(admin_client, "resume_workflows", ["w1", "w2"]) == ['Resumed 2 workflows: "w1", "w2".']
    assert status("w1") == status("w2") == "running"
    messages = act(admin_client, "resume_workflows", ["w3"])
    assert messages[0].startswith("1 workflow was not resumed (WorkflowStateError)")


@pytest.mark.django_db(transaction=True)
def test_retry_a_failed_run_from_its_checkpoint(admin_client, weft_run_until_idle):
    weft.start("tests.uncaught_activity_error", args=["admin-retry"], id="broken")
    weft.start("admin_tests.waits", id="fine")
    weft_run_until_idle()
    assert status("broken") == "failed"
    assert Step.objects.filter(workflow_id="broken", seq=1, status="failed").exists()
    messages = act(admin_client, "retry_workflows", ["broken", "fine"])
    assert messages[0] == 'Retried 1 workflow: "broken".'
    assert (
        messages[1].startswith("1 workflow was not retried (WorkflowStateError)")
        and "(it has not failed)" in messages[1]
    )
    assert status("broken") == "running"
    assert not Step.objects.filter(workflow_id="broken", seq=1).exists()  # the failing step runs again


def test_signal_action_shows_a_form_then_sends(admin_client, waiting):
    Workflow.objects.filter(pk="w3").update(status="completed")
    response = admin_client.post(
        CHANGELIST, {"action": "signal_workflows", "_selected_action": ["w1", "w3"], "index": "0"}
    )
    assert response.status_code == 200
    assert "admin/weft_django/workflow/signal.html" in [t.name for t in response.templates]
    form = {"action": "signal_workflows", "_selected_action": ["w1", "w3"], "apply": "1", "name": "go"}
    bad = admin_client.post(CHANGELIST, {**form, "payload": "{'single': 'quotes'}"})
    assert bad.status_code == 200 and "payload is not valid JSON" in bad.content.decode()
    nan = admin_client.post(CHANGELIST, {**form, "payload": "[NaN]"})
    assert "NaN is not valid codec output" in nan.content.decode()
    assert not BufferedSignal.objects.exists()  # nothing was written for bad input
    payload = '{"amount": {"$weft": "decimal", "v": "12.00"}, "ok": true}'
    response = admin_client.post(CHANGELIST, {**form, "payload": payload, "signal_id": "s-1"}, follow=True)
    assert response.redirect_chain
    messages = messages_of(response)
    assert messages[0] == 'Sent signal "go" to 1 workflow: "w1".'
    assert messages[1].startswith("1 workflow was not signalled (WorkflowTerminalError)")
    signal = BufferedSignal.objects.get()
    assert (signal.workflow_id, signal.name, signal.signal_id) == ("w1", "go", "s-1")
    assert codec.decode(signal.payload) == {"amount": Decimal("12.00"), "ok": True}


def test_purge_asks_then_purges_terminal_runs_only(admin_client, waiting):
    handle = weft.start("admin_tests.waits", idempotency_key="key-1")
    weft.cancel(handle.id)
    weft.cancel("w1")
    ids = [handle.id, "w1", "w2"]
    response = admin_client.post(CHANGELIST, {"action": "purge_workflows", "_selected_action": ids, "index": "0"})
    assert response.status_code == 200
    assert {row["id"] for row in response.context["purgeable"]} == {handle.id, "w1"}
    assert [row["id"] for row in response.context["active"]] == ["w2"]
    assert Workflow.objects.filter(pk__in=ids).count() == 3  # nothing yet
    response = admin_client.post(
        CHANGELIST, {"action": "purge_workflows", "_selected_action": ids, "post": "yes"}, follow=True
    )
    messages = messages_of(response)
    assert messages[0] == "Purged 2 terminal workflows."
    assert messages[1] == '1 workflow was not purged because it is still active: "w2". Cancel it first.'
    assert set(Workflow.objects.values_list("pk", flat=True)) == {"w2", "w3"}
    assert IdempotencyKey.objects.get(pk="key-1").purged_at is not None


# --------------------------------------------------------------------------- object buttons


def test_change_page_buttons_follow_status_and_permissions(admin_client, waiting):
    actions = [a["action"] for a in admin_client.get(f"{ADMIN}/workflow/w1/change/").context["object_actions"]]
    assert actions == ["cancel", "suspend", "signal"]
    weft.cancel("w2")
    actions = [a["action"] for a in admin_client.get(f"{ADMIN}/workflow/w2/change/").context["object_actions"]]
    assert actions == ["purge"]


def test_cancel_button_confirms_then_cancels_with_a_reason(admin_client, waiting):
    url = f"{ADMIN}/workflow/w1/act/cancel/"
    page = admin_client.get(url)
    assert page.status_code == 200 and status("w1") == "running"
    response = admin_client.post(url, {"reason": "customer asked"}, follow=True)
    assert response.redirect_chain == [(f"{ADMIN}/workflow/w1/change/", 302)]
    assert messages_of(response) == ['Cancelled 1 workflow: "w1".']
    assert Workflow.objects.get(pk="w1").cancel_reason == "cancelled in the Django admin by admin: customer asked"


def test_object_actions_suspend_resume_signal_purge(admin_client, waiting):
    base = f"{ADMIN}/workflow/w1/act"

    def post(action: str, data: dict | None = None) -> list[str]:
        response = admin_client.post(f"{base}/{action}/", data or {}, follow=True)
        assert response.status_code == 200
        return messages_of(response)

    assert admin_client.get(f"{base}/suspend/").status_code == 405  # changes need a POST
    assert post("suspend") == ['Suspended 1 workflow: "w1".'] and status("w1") == "suspended"
    assert post("resume") == ['Resumed 1 workflow: "w1".'] and status("w1") == "running"
    assert admin_client.get(f"{base}/signal/").status_code == 200
    assert post("signal", {"name": "go", "payload": "[1, 2]"}) == ['Sent signal "go" to 1 workflow: "w1".']
    assert codec.decode(BufferedSignal.objects.get().payload) == [1, 2]
    assert admin_client.get(f"{base}/nonsense/").status_code == 404
    assert post("purge")[0].startswith("1 workflow was not purged because it is still active")
    weft.cancel("w1")
    assert admin_client.get(f"{base}/purge/").status_code == 200
    response = admin_client.post(f"{base}/purge/", follow=True)
    assert response.redirect_chain == [(CHANGELIST, 302)] and not Workflow.objects.filter(pk="w1").exists()
    assert messages_of(response) == ["Purged 1 terminal workflow."]
    response = admin_client.post(f"{ADMIN}/workflow/ghost/act/suspend/", follow=True)
    assert messages_of(response)[0].startswith("1 workflow was not suspended (WorkflowNotFoundError)")


# --------------------------------------------------------------------------- permissions, CSRF


@pytest.fixture
def operator(db, django_user_model):
    """Staff with view permissions plus cancel_workflow only."""
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="weft_django", codename__startswith="view_"),
        Permission.objects.get(codename="cancel_workflow"),
    )
    client = Client()
    client.force_login(user)
    return client


def test_each_action_checks_its_own_permission(operator, waiting):
    page = operator.get(CHANGELIST).content.decode()
    for allowed in ("cancel_workflows", "suspend_workflows", "resume_workflows"):
        assert allowed in page
    for refused in ("retry_workflows", "signal_workflows", "purge_workflows"):
        assert refused not in page
    assert act(operator, "signal_workflows", ["w1"], apply="1", name="go") == ["No action selected."]
    assert act(operator, "purge_workflows", ["w1"], post="yes") == ["No action selected."]
    assert not BufferedSignal.objects.exists()
    for action in ("signal", "purge", "retry"):
        assert operator.post(f"{ADMIN}/workflow/w1/act/{action}/", {"name": "go"}).status_code == 403
    assert operator.get(f"{ADMIN}/workflow/w1/act/signal/").status_code == 403
    assert act(operator, "cancel_workflows", ["w1"]) == ['Cancelled 1 workflow: "w1".']


def test_viewer_cannot_act(waiting, django_user_model):
    user = django_user_model.objects.create_user("viewer2", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflow"))
    client = Client()
    client.force_login(user)
    assert act(client, "cancel_workflows", ["w1"]) == []  # no action is offered, so none runs
    assert client.post(f"{ADMIN}/workflow/w1/act/cancel/").status_code == 403
    assert client.post(f"{ADMIN}/workflow/w1/act/suspend/").status_code == 403
    assert status("w1") == "running"


def test_actions_enforce_csrf(admin_user, waiting):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    data = {"action": "cancel_workflows", "_selected_action": ["w1"], "index": "0"}
    assert client.post(CHANGELIST, data).status_code == 403
    assert client.post(f"{ADMIN}/workflow/w1/act/cancel/").status_code == 403
    assert status("w1") == "running"
    client.get(CHANGELIST)  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(CHANGELIST, {**data, "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and status("w1") == "cancelled"


# --------------------------------------------------------------------------- the timeline


@pytest.mark.django_db(transaction=True)
def test_timeline_draws_steps_timers_and_failures(admin_client, weft_run_until_idle):
    weft.start("tests.three_steps", args=["timeline"], id="three")
    weft.start("tests.retrying", args=["timeline", 2], id="retried")
    weft.start("tests.sleeper", args=[3600], id="asleep")
    weft.start("tests.uncaught_activity_error", args=["timeline"], id="failed")
    weft.start("tests.signals", id="waiting")
    weft_run_until_idle()

    timeline = admin_client.get(f"{ADMIN}/workflow/three/change/").context["timeline"]
    assert [bar.label for bar in timeline.bars] == [
        "#0 activity record_call",
        "#1 activity record_call",
        "#2 activity record_call",
    ]
    assert [bar.state for bar in timeline.bars] == ["completed"] * 3
    lefts = [bar.left for bar in timeline.bars]
    assert lefts == sorted(lefts) and all(0 <= bar.left <= 100 and 0 < bar.width <= 100 for bar in timeline.bars)
    assert timeline.now_left is None  # finished: no "now" line
    assert timeline.ticks[0].label == "+0 ms"

    retried = admin_client.get(f"{ADMIN}/workflow/retried/change/").context["timeline"]
    assert retried.bars[0].detail.startswith("3 attempts; last failed attempt: ")  # it succeeded on the third

    asleep = admin_client.get(f"{ADMIN}/workflow/asleep/change/")
    bars = asleep.context["timeline"].bars
    assert [(bar.kind, bar.state) for bar in bars] == [("timer", "pending")]
    assert "fires at" in bars[0].detail and asleep.context["timeline"].now_left is not None

    failed = admin_client.get(f"{ADMIN}/workflow/failed/change/")
    assert [bar.state for bar in failed.context["timeline"].bars] == ["completed", "failed"]
    assert "ValueError: bad input" in failed.context["timeline"].bars[1].detail
    html = failed.content.decode()
    assert "weft-bar-failed" in html and "Traceback" in html

    waiting = admin_client.get(f"{ADMIN}/workflow/waiting/change/").context["timeline"]
    assert [(bar.kind, bar.state) for bar in waiting.bars] == [("waiting", "waiting")]
