"""A workflow id started again with on_conflict="start_new" over a finished run: the new run's
children with default ids must not collide with the old run's children (still stored)."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django import transitions
from weft_django.conf import database_alias
from weft_django.models import Workflow
from weft_django.store.histories import load_runs

pytestmark = pytest.mark.django_db(transaction=True)


# An id holding what a LIKE pattern reads as its own characters: a backslash (PostgreSQL's escape), % and _.
@pytest.mark.parametrize("wid", ["again", "back\\slash", "50%_off"])
def test_start_new_run_starts_its_own_default_id_children(weft_run_until_idle, wid):
    first = weft.start("tests.parent", args=["one", 2], id=wid)
    weft_run_until_idle()
    assert first.result(timeout=5) == ["one-0", "one-1"]
    assert not load_runs([wid], database_alias())[wid].continued  # a first run: ids <id>/<seq>
    second = weft.start("tests.parent", args=["two", 2], id=wid, on_conflict="start_new")
    weft_run_until_idle()
    assert second.result(timeout=5) == ["two-0", "two-1"]
    run_id = str(Workflow.objects.get(id=wid).run_id)
    kids = set(Workflow.objects.filter(parent_id=wid).values_list("id", flat=True))
    # the first run's two children are kept; the second run's have run-qualified ids
    assert kids == {f"{wid}/1", f"{wid}/2", f"{wid}/{run_id}/1", f"{wid}/{run_id}/2"}
    # Once the first run's children are purged, the second run still names its children as it did (a
    # retried child step finds its own child again).
    transitions.purge([f"{wid}/1", f"{wid}/2"])
    assert load_runs([wid], database_alias())[wid].continued


def test_an_id_started_again_after_its_purge_starts_its_own_children(weft_run_until_idle):
    first = weft.start("tests.parent", args=["one", 1], id="reused")
    weft_run_until_idle()
    assert first.result(timeout=5) == ["one-0"]
    transitions.purge("reused")  # the parent only: its child "reused/1" stays
    second = weft.start("tests.parent", args=["two", 1], id="reused")
    weft_run_until_idle()
    assert second.result(timeout=5) == ["two-0"]
    run_id = str(Workflow.objects.get(id="reused").run_id)
    assert set(Workflow.objects.filter(parent_id="reused").values_list("id", flat=True)) == {
        "reused/1",
        f"reused/{run_id}/1",
    }
