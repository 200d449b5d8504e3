"""A parent's child start racing a client's start of the same id (PostgreSQL: the in-process engine
on one thread, the client on another, released together by a barrier; the client is held back by a
different delay each round so that either insert comes first).

The child's row is inserted inside the parent's fenced commit; the client's start inserts the same
primary key. Whichever commits first keeps the id: the client's start then gets
WorkflowAlreadyExistsError, or the parent's child start is reported to the parent as a failed child
(WorkflowAlreadyExistsError in its ChildWorkflowError). Never an IntegrityError, two rows, or a parent
waiting for ever for a child that was never started.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from tests.races import race
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
HOLD_BACK = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2)


def test_a_child_start_racing_a_client_start_of_its_id_keeps_one_run():
    seen = set()
    for round_, hold in enumerate(HOLD_BACK):
        parent = weft.start("tests.parent_waits_forever", args=["terminate"], id=f"cr-{round_}")
        kid = f"{parent.id}-kid"
        driven, started = race(
            lambda n=round_: run_until_idle(engine_id=f"child-race-{n}"),
            lambda kid=kid: weft.start("tests.signals", id=kid),
            delays=(0.0, hold),
        )
        assert driven is None, driven
        row = Workflow.objects.get(pk=kid)
        if isinstance(started, weft.WorkflowAlreadyExistsError):
            seen.add("the parent's child first")
            assert (row.parent_id, row.status) == (parent.id, "running")
            assert Workflow.objects.get(pk=parent.id).status == "running"  # waits for its child
            continue
        assert isinstance(started, weft.WorkflowHandle), started
        seen.add("the client's start first")
        assert row.parent_id is None
        run_until_idle(engine_id=f"child-race-{round_}-after")  # the parent learns that its child failed
        ended = Workflow.objects.get(pk=parent.id)
        assert ended.status == "failed", ended.status
        assert "WorkflowAlreadyExistsError" in str(ended.error), ended.error
    print("child start vs client start:", sorted(seen))
