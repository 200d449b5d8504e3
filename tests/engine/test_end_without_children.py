"""A run that never started a child skips the descendant queries when it ends (issue 16: they were
the largest item of the engine loop with 10,000 runs ending); a run that did start one still closes
its children at its end (PostgreSQL and SQLite)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _descendant_queries(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "WITH RECURSIVE" in q["sql"] or '"parent_id" IN' in q["sql"]]


def test_childless_runs_end_without_a_descendant_query():
    handles = [weft.start("tests.sum", args=[i, 1], id=f"nochild-{i}") for i in range(20)]  # > one statement's 16
    with CaptureQueriesContext(connection) as queries:
        run_until_idle()
    assert [h.result(timeout=5)["total"] for h in handles] == [i + 1 for i in range(20)]
    assert _descendant_queries(queries) == []


def test_a_run_that_started_children_still_closes_them_at_its_end():
    handle = weft.start("tests.parent_races_child", id="ends-with-kid")
    with CaptureQueriesContext(connection) as queries:
        run_until_idle()
    assert handle.result(timeout=5) == 1  # the activity won the race; the child was still waiting
    assert Workflow.objects.get(pk="ends-with-kid-kid").status == "cancelled"
    assert _descendant_queries(queries) != []
