"""The admin's purge (list action and a workflow page's button) against runs that change between the
confirmation and the purge: a run started again meanwhile (on_conflict="start_new") is left alone AND
reported, the others are purged. Before (rev14), a run started again after the admin read the
statuses was passed over in silence ("Purged 1 terminal workflow." and nothing about the other)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

import weft_django as weft
from tests.admin.test_admin import ADMIN
from tests.admin.test_admin_actions import messages_of
from weft_django.models import Workflow
from weft_django.store import claims

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = f"{ADMIN}/workflow/"


def _start_again_before_the_purge_locks(monkeypatch, workflow_id: str) -> None:
    """Once, right before the purge's transaction locks the claims: another process starts
    ``workflow_id`` again over its finished run (its own connection, committed)."""
    original = claims.lock_ids
    done = threading.Event()

    def start_again() -> None:
        try:
            weft.start("admin_tests.waits", id=workflow_id, on_conflict="start_new")
        finally:
            connections.close_all()

    def lock_ids(ids, using, **kwargs):
        if not done.is_set() and workflow_id in ids:
            done.set()
            thread = threading.Thread(target=start_again)
            thread.start()
            thread.join()
        return original(ids, using, **kwargs)

    monkeypatch.setattr(claims, "lock_ids", lock_ids)


@pytest.mark.postgres  # SQLite's purge holds the write lock from BEGIN: nobody starts a run inside it
def test_a_run_started_again_during_a_list_purge_is_reported_not_passed_over(admin_client, monkeypatch):
    for workflow_id in ("pr-1", "pr-2"):
        weft.start("admin_tests.waits", id=workflow_id)
        weft.cancel(workflow_id)
    _start_again_before_the_purge_locks(monkeypatch, "pr-2")
    response = admin_client.post(
        CHANGELIST, {"action": "purge_workflows", "_selected_action": ["pr-1", "pr-2"], "post": "yes"}, follow=True
    )
    assert list(Workflow.objects.values_list("pk", "status")) == [("pr-2", "running")]
    assert messages_of(response) == [
        "Purged 1 terminal workflow.",
        '1 workflow was not purged because it is still active: "pr-2". Cancel it first.',
    ]


class _StartsAgainFirst:
    """``weft_django.admin.actions.transitions``, as seen by the admin: the first thing it calls there
    is preceded by another process starting ``workflow_id`` again (after the admin read the statuses)."""

    def __init__(self, real, workflow_id: str) -> None:
        self.real, self.workflow_id, self.done = real, workflow_id, False

    def __getattr__(self, name: str):
        if not self.done:
            self.done = True
            thread = threading.Thread(target=self._start_again)
            thread.start()
            thread.join()
        return getattr(self.real, name)

    def _start_again(self) -> None:
        try:
            weft.start("admin_tests.waits", id=self.workflow_id, on_conflict="start_new")
        finally:
            connections.close_all()


def test_a_run_started_again_after_the_statuses_were_read_leaves_the_others_purged(admin_client, monkeypatch):
    from weft_django.admin import actions

    for workflow_id in ("pr-1", "pr-2"):
        weft.start("admin_tests.waits", id=workflow_id)
        weft.cancel(workflow_id)
    monkeypatch.setattr(actions, "transitions", _StartsAgainFirst(actions.transitions, "pr-2"))
    response = admin_client.post(
        CHANGELIST, {"action": "purge_workflows", "_selected_action": ["pr-1", "pr-2"], "post": "yes"}, follow=True
    )
    assert list(Workflow.objects.values_list("pk", "status")) == [("pr-2", "running")]
    assert messages_of(response) == [
        "Purged 1 terminal workflow.",
        '1 workflow was not purged because it is still active: "pr-2". Cancel it first.',
    ]


def test_a_pages_purge_leaves_a_run_started_over_the_one_it_confirmed(admin_client):
    weft.start("admin_tests.waits", id="pp")
    weft.cancel("pp")
    seen = str(Workflow.objects.get(pk="pp").run_id)
    confirmation = admin_client.get(f"{ADMIN}/workflow/pp/act/purge/").content.decode()
    weft.start("admin_tests.waits", id="pp", on_conflict="start_new")  # meanwhile: a new run, never seen
    weft.cancel("pp", "the new run ended too")
    newer = str(Workflow.objects.get(pk="pp").run_id)
    response = admin_client.post(f"{ADMIN}/workflow/pp/act/purge/", {"post": "yes", "run_id": seen}, follow=True)
    assert Workflow.objects.filter(pk="pp", run_id=newer).exists(), "the run the page never showed was purged"
    texts = messages_of(response)
    assert any(seen in text and "no longer the current run" in text for text in texts), texts
    assert f'<input type="hidden" name="run_id" value="{seen}">' in confirmation  # what the button sends
    # the page of the current run purges it
    response = admin_client.post(f"{ADMIN}/workflow/pp/act/purge/", {"post": "yes", "run_id": newer}, follow=True)
    assert not Workflow.objects.filter(pk="pp").exists()
    assert messages_of(response) == ["Purged 1 terminal workflow."]
