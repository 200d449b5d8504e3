"""A transition that closes a family (cancel, time out: the run's children per their policy) locks the
claims of the run and of its active descendants in ONE statement, sorted by workflow id, as every
other locker does. Before the fix (found by a helper's review, session 17) it locked the run first and
its descendants in a second statement: with a child whose id sorts below its parent's, cancel(parent)
and cancel(grandparent) could deadlock (each holding a row the other wanted next)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.models import Workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@weft.workflow(name="tests.family_parent")
def family_parent(ctx):
    yield ctx.start_child("tests.signals", id="a-child-sorting-first")
    return "done"


def _claim_locks(queries: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if "weft_django_workflowclaim" in q["sql"] and "FOR NO KEY UPDATE" in q["sql"]]


def test_cancelling_a_run_locks_it_and_its_children_in_one_sorted_statement(weft_run_until_idle):
    parent = weft.start(family_parent, id="z-parent")
    weft_run_until_idle()
    assert Workflow.objects.get(pk="a-child-sorting-first").status == "running"
    with CaptureQueriesContext(connection) as queries:
        parent.cancel("stop the family")
    locks = _claim_locks(queries.captured_queries)
    assert len(locks) == 1, f"the family was locked in {len(locks)} statements: {locks}"
    assert "a-child-sorting-first" in locks[0] and "z-parent" in locks[0]
    assert locks[0].index("a-child-sorting-first") < locks[0].index("z-parent")
    weft_run_until_idle()
    assert Workflow.objects.get(pk="a-child-sorting-first").status == "cancelled"
