"""SQLite: calls whose statements bind one parameter per id of a list as long as the caller's input
(``start_many``, ``purge``) must not pass SQLite's limit on a statement's parameters ("too many SQL
variables"): such lists go in chunks (``store.backend.Backend.chunks``), in the call's one transaction;
an attribute filter's ``__in`` list (one EXISTS, no chunks) goes as one JSON array past the limit.
The limit is lowered to 999 for speed (tests/param_limit.py): the same statements fail with 33,000
ids on SQLite's default limit of 32,766 (start_many takes 100,000 requests)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import weft_django as weft
from tests.param_limit import OVER, lowered_param_limit
from weft_django import transitions
from weft_django.models import IdempotencyKey, Workflow, WorkflowAttribute, WorkflowClaim

pytestmark = [pytest.mark.sqlite, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _low_param_limit():
    with lowered_param_limit():
        yield


def ids(prefix: str) -> list[str]:
    return [f"{prefix}-{i:05}" for i in range(OVER)]


def finish(workflow_ids: list[str]) -> None:
    Workflow.objects.filter(pk__in=workflow_ids[:500]).update(status="completed", result="3")
    Workflow.objects.filter(pk__in=workflow_ids[500:]).update(status="completed", result="3")


def test_start_many_over_the_limit_writes_every_run_with_its_attributes_and_key():
    requests = [
        weft.StartRequest("visibility.order", args=["c", 1.0], attributes={"customer": "c", "tags": ["a", "b"]})
        for _ in range(OVER)
    ]
    requests += [weft.StartRequest("tests.sum", args=[1, 2], idempotency_key=key) for key in ids("key")]
    results = weft.start_many(requests)
    assert {type(result) for result in results} == {weft.WorkflowHandle}
    assert (Workflow.objects.count(), WorkflowClaim.objects.count(), IdempotencyKey.objects.count()) == (
        2 * OVER,
        2 * OVER,
        OVER,
    )
    assert WorkflowAttribute.objects.count() == 3 * OVER
    again = weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], idempotency_key=key) for key in ids("key")])
    assert [handle.id for handle in again] == [handle.id for handle in results[OVER:]]


def test_start_many_start_new_over_the_limit_replaces_every_finished_run():
    weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id=wid) for wid in ids("again")])
    finish(ids("again"))
    runs = dict(Workflow.objects.values_list("pk", "run_id"))
    results = weft.start_many(
        [weft.StartRequest("tests.sum", args=[1, 2], id=wid, on_conflict="start_new") for wid in ids("again")]
    )
    assert [handle.id for handle in results] == ids("again")
    assert set(Workflow.objects.values_list("status", flat=True)) == {"running"}
    assert not any(run == runs[pk] for pk, run in Workflow.objects.values_list("pk", "run_id"))


def test_start_many_over_the_limit_is_all_or_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id=wid) for wid in ids("undone")])
        assert Workflow.objects.count() == OVER
        raise RuntimeError("the caller's transaction rolls back")
    assert (Workflow.objects.count(), WorkflowClaim.objects.count()) == (0, 0)


def test_purge_with_a_batch_over_the_limit_purges_every_run():
    weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], idempotency_key=key) for key in ids("p")])
    keyed = list(Workflow.objects.values_list("pk", flat=True))
    finish(keyed)
    assert transitions.purge(keyed, batch_size=OVER) == OVER
    assert (Workflow.objects.count(), WorkflowClaim.objects.count()) == (0, 0)
    assert IdempotencyKey.objects.filter(purged_at__isnull=False).count() == OVER


def test_purge_of_a_queryset_with_a_batch_over_the_limit_purges_every_run():
    weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id=wid) for wid in ids("q")])
    finish(ids("q"))
    assert transitions.purge(Workflow.objects.filter(pk__startswith="q-"), batch_size=OVER) == OVER
    assert (Workflow.objects.count(), WorkflowClaim.objects.count()) == (0, 0)


def test_purge_terminal_over_the_limit_purges_every_run():
    weft.start_many([weft.StartRequest("tests.sum", args=[1, 2], id=wid) for wid in ids("t")])
    finish(ids("t"))
    assert transitions.purge_terminal(ids("t")) == OVER
    assert (Workflow.objects.count(), WorkflowClaim.objects.count()) == (0, 0)


def test_an_attribute_in_filter_with_more_values_than_the_limit_finds_its_runs():
    placed = timezone.now().replace(microsecond=123456)
    weft.start_many(
        [
            weft.StartRequest(
                "visibility.order",
                args=[f"c{i}", 1.0],
                id=f"order-{i}",
                attributes={"customer": f"c{i}", "amount": i + 0.5, "items": i, "vip": i == 1, "placed_at": placed},
            )
            for i in range(3)
        ]
    )
    customers = [f"c{i}" for i in range(OVER)]
    amounts = [i + 0.5 for i in range(1, OVER)]  # not 0.5: order-0 is left out
    moments = [placed + timedelta(seconds=i) for i in range(OVER)]
    items = list(range(2, OVER))
    assert weft.count_workflows(attributes={"customer__in": customers}) == 3
    assert {s.id for s in weft.list_workflows(attributes={"amount__in": amounts})} == {"order-1", "order-2"}
    assert weft.count_workflows(attributes={"placed_at__in": moments, "items__in": items}) == 1
    assert weft.bulk_count("cancel", attributes={"customer__in": customers, "vip__in": [True, False]}) == 3


def test_two_attribute_in_filters_each_under_the_limit_but_over_it_together_find_their_runs():
    weft.start_many(
        [
            weft.StartRequest(
                "visibility.order",
                args=[f"c{i}", 1.0],
                id=f"both-{i}",
                attributes={"customer": f"c{i}", "items": i},
            )
            for i in range(3)
        ]
    )
    customers = [f"c{i}" for i in range(600)]  # each list alone fits one statement; the two do not
    items = list(range(1, 601))
    filters = {"customer__in": customers, "items__in": items}
    assert weft.count_workflows(attributes=filters) == 2
    assert {s.id for s in weft.list_workflows(attributes=filters)} == {"both-1", "both-2"}
