"""A workflow page's buttons act on the run the page showed: clicked after that run continued as new,
they change nothing and say which run is current (the page sends its run_id; the transition checks it
under the claim's lock). Before, the page's Suspend suspended the new run, which the operator never saw."""

from __future__ import annotations

import re

import pytest

import weft_django as weft
from tests.admin.test_admin import ADMIN
from tests.admin.test_admin_actions import messages_of
from weft_django import transitions
from weft_django.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.stale_run.chain")
def chain(ctx, n=0):
    yield ctx.wait_for_signal("next")
    return ctx.continue_as_new(n + 1)


def _hidden_run_ids(html: str) -> set[str]:
    return set(re.findall(r'<input type="hidden" name="run_id" value="([^"]+)">', html))


def _continue(weft_run_until_idle) -> None:
    weft.signal("ch", "next")
    weft_run_until_idle()


def test_suspend_button_of_a_run_that_continued_as_new_meanwhile(admin_client, weft_run_until_idle):
    weft.start("tests.stale_run.chain", id="ch")
    weft_run_until_idle()
    seen = str(Workflow.objects.get(pk="ch").run_id)
    page = admin_client.get(f"{ADMIN}/workflow/ch/change/")
    suspend = next(item for item in page.context["object_actions"] if item["action"] == "suspend")
    assert _hidden_run_ids(page.content.decode()) == {seen}
    _continue(weft_run_until_idle)  # between the page load and the click: the run it showed ends
    now_run = Workflow.objects.get(pk="ch")
    assert str(now_run.run_id) != seen and now_run.status == "running"
    response = admin_client.post(suspend["url"], {"run_id": seen}, follow=True)  # what the button sends
    assert Workflow.objects.get(pk="ch").status == "running", "the new run, never seen, was suspended"
    texts = messages_of(response)
    assert any(seen in text and str(now_run.run_id) in text and "not changed" in text for text in texts), texts
    assert any(m.level_tag == "error" for m in response.context["messages"])


def test_cancel_confirmation_of_a_run_that_continued_as_new_meanwhile(admin_client, weft_run_until_idle):
    weft.start("tests.stale_run.chain", id="ch")
    weft_run_until_idle()
    seen = str(Workflow.objects.get(pk="ch").run_id)
    page = admin_client.get(f"{ADMIN}/workflow/ch/change/")
    cancel = next(item for item in page.context["object_actions"] if item["action"] == "cancel")
    confirmation = admin_client.get(cancel["url"])
    assert _hidden_run_ids(confirmation.content.decode()) == {seen}
    _continue(weft_run_until_idle)
    admin_client.post(cancel["url"], {"reason": "stale", "run_id": seen})
    assert Workflow.objects.get(pk="ch").status == "running"


def test_the_buttons_of_a_fresh_page_act_on_the_run_it_shows(admin_client, weft_run_until_idle):
    weft.start("tests.stale_run.chain", id="ch")
    weft_run_until_idle()
    _continue(weft_run_until_idle)
    page = admin_client.get(f"{ADMIN}/workflow/ch/change/")
    suspend = next(item for item in page.context["object_actions"] if item["action"] == "suspend")
    (shown,) = _hidden_run_ids(page.content.decode())
    admin_client.post(suspend["url"], {"run_id": shown})
    assert Workflow.objects.get(pk="ch").status == "suspended"


def test_a_transition_given_a_run_that_is_no_longer_current_refuses_and_writes_nothing(weft_run_until_idle):
    weft.start("tests.stale_run.chain", id="ch")
    weft_run_until_idle()
    seen = str(Workflow.objects.get(pk="ch").run_id)
    _continue(weft_run_until_idle)
    before = Workflow.objects.values("run_id", "status", "updated_at").get(pk="ch")
    for call in (transitions.suspend, transitions.cancel, transitions.time_out):
        with pytest.raises(weft.WorkflowStateError, match="is current now"):
            call("ch", run_id=seen)
    assert Workflow.objects.values("run_id", "status", "updated_at").get(pk="ch") == before
    transitions.suspend("ch", run_id=str(before["run_id"]))  # the current run: applied
    assert Workflow.objects.get(pk="ch").status == "suspended"
