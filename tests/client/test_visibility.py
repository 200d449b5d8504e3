"""Search attributes (declared, set in workflow code and at start, durable with the fenced commit),
list_workflows / count_workflows (filters, keyset pages, summaries), and their bad inputs (issue 19)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps

import weft_django as weft
from weft_django.exceptions import InvalidFilterError, InvalidSearchAttributeError, WorkflowDefinitionError
from weft_django.models import Workflow, WorkflowAttribute
from weft_django.testing import run_until_idle
from weft_django.visibility import decode_cursor

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


def test_attributes_set_in_workflow_code_are_durable_and_typed():
    handle = weft.start("visibility.order", args=["acme", 150.0], kwargs={"tags": ["eu", "rush", "eu"]})
    run_until_idle()
    assert handle.status == "completed"
    [summary] = weft.list_workflows(workflow_type="visibility.order")
    assert summary.id == handle.id
    assert summary.handle == handle
    assert summary.attributes == {
        "customer": "acme",
        "amount": 150.0,
        "stage": "shipped",  # the last value set wins
        "vip": True,
        "tags": ["eu", "rush"],  # a keyword list keeps each keyword once, in order
    }
    rows = WorkflowAttribute.objects.filter(workflow_id=handle.id)
    assert {row.kind for row in rows} == {"str", "float", "bool", "keywords"}


def test_attributes_at_start_and_filters():
    placed = datetime(2026, 1, 1, tzinfo=UTC)
    a = weft.start(
        "visibility.order", args=["a", 5.0], attributes={"customer": "acme", "items": 3, "placed_at": placed}
    )
    b = weft.start("visibility.order", args=["b", 50.0], attributes={"customer": "beta", "items": 7})
    c = weft.start("visibility.order", args=["c", 500.0], attributes={"customer": "acme", "tags": ["vip"]})
    ids = lambda page: [s.id for s in page]  # noqa: E731

    assert ids(weft.list_workflows(attributes={"customer": "acme"})) == [c.id, a.id]  # newest first
    assert ids(weft.list_workflows(attributes={"items__gte": 3, "items__lt": 7})) == [a.id]
    assert ids(weft.list_workflows(attributes={"items__in": [7, 8]})) == [b.id]
    assert ids(weft.list_workflows(attributes={"placed_at__lte": placed})) == [a.id]
    assert ids(weft.list_workflows(attributes={"tags": "vip"})) == [c.id]
    assert ids(weft.list_workflows(attributes={"tags__exists": False})) == [b.id, a.id]
    assert weft.count_workflows(attributes={"customer": "acme"}) == 2
    assert weft.count_workflows(status="running", workflow_type="visibility.order") == 3
    assert weft.count_workflows(status=["completed"]) == 0
    assert ids(weft.list_workflows(id_prefix=a.id[:8])) == [a.id]
    assert weft.count_workflows(parent_id="nobody") == 0
    assert weft.count_workflows(schedule_id="nothing") == 0

    run_until_idle()  # the code's own set_attributes replace the start's customer, keep items
    assert ids(weft.list_workflows(attributes={"customer": "acme"})) == []
    assert ids(weft.list_workflows(attributes={"customer": "a", "items": 3})) == [a.id]
    assert ids(weft.list_workflows(attributes={"amount__gt": 10.0, "vip": True})) == [c.id]
    now = Workflow.objects.get(pk=c.id).finished_at
    assert weft.count_workflows(ended_after=now - timedelta(minutes=5), status="completed") == 3
    assert weft.count_workflows(ended_before=now - timedelta(minutes=5)) == 0
    assert weft.count_workflows(started_after=now + timedelta(minutes=5)) == 0
    assert weft.count_workflows(created_before=now + timedelta(minutes=5), created_after=now - timedelta(hours=1)) == 3


def test_keyset_pages_cover_every_run_once_even_as_runs_are_added():
    started = [weft.start("visibility.order", args=[f"c{i}", float(i)]).id for i in range(7)]
    seen: list[str] = []
    page = weft.list_workflows(limit=3)
    assert len(page) == 3 and page.next_cursor is not None
    seen += [s.id for s in page]
    weft.start("visibility.order", args=["late", 1.0])  # newer than the cursor: not on later pages
    while page.next_cursor is not None:
        page = weft.list_workflows(limit=3, cursor=page.next_cursor)
        seen += [s.id for s in page]
    assert seen == list(reversed(started))
    assert decode_cursor(weft.list_workflows(limit=1).next_cursor)[1]  # a cursor names (created_at, id)


def test_async_variants():
    weft.start("visibility.order", args=["x", 1.0], attributes={"customer": "x"})
    page = asyncio.run(weft.alist_workflows(attributes={"customer": "x"}))
    assert len(page) == 1
    assert asyncio.run(weft.acount_workflows(attributes={"customer": "x"})) == 1


def test_a_bad_attribute_in_workflow_code_fails_the_run_with_a_clear_message():
    undeclared = weft.start("visibility.bad_attribute", args=["colour", "red"])
    wrong_type = weft.start("visibility.bad_attribute", args=["amount", "12"])
    run_until_idle()
    for handle, words in ((undeclared, "'colour' is not declared"), (wrong_type, "is a float")):
        row = Workflow.objects.get(pk=handle.id)
        assert row.status == "failed"
        assert row.error["type"] == "InvalidSearchAttributeError"
        assert words in row.error["message"]
        assert not WorkflowAttribute.objects.filter(workflow_id=handle.id).exists()


def test_workflow_code_may_catch_the_error():
    handle = weft.start("visibility.caught_bad_attribute")
    run_until_idle()
    assert "is a float" in handle.result(timeout="5s")
    assert weft.list_workflows(attributes={"amount": 1.0}).workflows[0].id == handle.id


BAD_STARTS = [
    ({"colour": "red"}, "not declared"),
    ({"amount": "12"}, "is a float"),
    ({"items": 1.5}, "whole number"),
    ({"items": True}, "is an int"),
    ({"items": 2**60}, "2**53"),
    ({"vip": 1}, "True or False"),
    ({"placed_at": datetime(2026, 1, 1)}, "aware datetime"),
    ({"tags": "vip"}, "list of strings"),
    ({"tags": ["ok", 3]}, "is text"),
    ({"customer": "x" * 501}, "at most 500"),
    ({"customer": "nul\x00"}, "no NUL"),
    ({"amount": float("nan")}, "finite"),
    ("customer=acme", "dict"),
]


@pytest.mark.parametrize(("attributes", "words"), BAD_STARTS)
def test_bad_start_attributes_are_refused_and_nothing_is_written(attributes, words):
    before = snapshot()
    with pytest.raises(InvalidSearchAttributeError, match=words.replace("*", r"\*")):
        weft.start("visibility.order", args=["a", 1.0], attributes=attributes)
    assert snapshot() == before


BAD_FILTERS = [
    ({"colour": "red"}, {}, "Unknown filter"),
    ({"status": "done"}, {}, "Unknown status"),
    ({"status": []}, {}, "non-empty list"),
    ({"attributes": {"nosuch": 1}}, {}, "no registered workflow declares"),
    ({"attributes": {"amount__near": 1}}, {}, "unknown operator"),
    ({"attributes": {"amount": "12"}}, {}, "declared as float"),
    ({"attributes": {"vip__gt": True}}, {}, "bool attribute"),
    ({"attributes": {"amount__in": 3}}, {}, "non-empty list"),
    ({"attributes": {"amount__exists": "yes"}}, {}, "True or False"),
    ({"attributes": {"placed_at__gte": datetime(2026, 1, 1)}}, {}, "aware datetime"),
    ({"attributes": {"amount": float("inf")}}, {}, "finite"),
    ({"attributes": ["amount"]}, {}, "must be a dict"),
    ({"created_after": "2026-01-01"}, {}, "aware datetime"),
    ({"parent_id": ""}, {}, "non-empty string"),
    ({}, {"limit": 0}, "limit must be"),
    ({}, {"limit": 5000}, "limit must be"),
    ({}, {"cursor": "not-a-cursor"}, "not a cursor"),
    ({}, {"cursor": 12}, "not a cursor"),
]


@pytest.mark.parametrize(("filters", "paging", "words"), BAD_FILTERS)
def test_bad_filters_are_refused_before_any_query(filters, paging, words, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidFilterError, match=words):
        weft.list_workflows(**filters, **paging)
    if not paging:
        with pytest.raises(InvalidFilterError, match=words):
            weft.count_workflows(**filters)


@pytest.mark.parametrize(
    ("attributes", "words"),
    [
        ({"a__b": str}, "single underscores"),
        ({"1st": str}, "start with a letter"),
        ({"x": dict}, "use str, int"),
        ({"x": list[int]}, "use str, int"),
        ("customer", "dict of name"),
    ],
)
def test_bad_declarations_are_definition_errors(attributes, words):
    def body(ctx):
        yield ctx.sleep(0)

    with pytest.raises(WorkflowDefinitionError, match=words):
        weft.workflow(name=f"visibility.bad_declaration.{words}", attributes=attributes)(body)


def test_update_handlers_set_attributes_and_replay_writes_the_same_values():
    from weft_django.testing import owns, running_engine, wait_for

    handle = weft.start("visibility.tagged")
    with running_engine("visibility-tagged") as engine:
        owns(engine, handle.id)
        assert handle.update("stage", "reviewed", timeout="10s") == "reviewed"
        wait_for(lambda: weft.count_workflows(attributes={"stage": "reviewed"}) == 1, message="the update's attribute")
    run_until_idle()  # another engine replays the run: "new", then the re-applied update's "reviewed"
    assert weft.list_workflows().workflows[0].attributes == {"stage": "reviewed"}
    weft.signal(handle.id, "done")
    run_until_idle()
    assert handle.result(timeout="5s") == {"stage": "reviewed"}  # ctx.attributes: the current values


def test_a_new_run_over_an_id_starts_without_the_old_runs_attributes():
    weft.start("visibility.order", args=["a", 1.0], id="reused", attributes={"items": 4})
    run_until_idle()
    assert weft.list_workflows(id_prefix="reused").workflows[0].attributes["items"] == 4
    weft.start("visibility.order", args=["b", 2.0], id="reused", on_conflict="start_new")
    assert weft.list_workflows(id_prefix="reused").workflows[0].attributes == {}
    weft.start("visibility.order", args=["c", 2.0], id="reused2", attributes={"items": 1})
    run_until_idle()
    weft.start("visibility.order", args=["c", 2.0], id="reused2", on_conflict="start_new", attributes={"vip": True})
    assert weft.list_workflows(id_prefix="reused2").workflows[0].attributes == {"vip": True}
    assert weft.list_workflows(id_prefix="reused2").workflows[0].status is weft.WorkflowStatus.RUNNING


def test_start_attributes_with_an_idempotency_key_are_written_once():
    first = weft.start("visibility.order", args=["a", 1.0], idempotency_key="k-1", attributes={"items": 5})
    again = weft.start("visibility.order", args=["a", 1.0], idempotency_key="k-1", attributes={"items": 6})
    assert first == again
    assert WorkflowAttribute.objects.filter(workflow_id=first.id).count() == 1
    assert weft.list_workflows().workflows[0].attributes == {"items": 5}  # the first start's


def test_start_many_writes_each_requests_attributes_with_its_run():
    first, taken = weft.start_many(
        [
            weft.StartRequest("visibility.order", args=["a", 5.0], attributes={"customer": "bulk", "items": 2}),
            weft.StartRequest("visibility.order", args=["b", 6.0], idempotency_key="vis-key"),
        ]
    )
    again = weft.start_many(
        [
            weft.StartRequest(
                "visibility.order", args=["b", 6.0], idempotency_key="vis-key", attributes={"customer": "no"}
            )
        ]
    )
    assert again[0].id == taken.id  # the key's first run: its (absent) attributes are not written again
    assert [s.id for s in weft.list_workflows(attributes={"customer": "bulk"})] == [first.id]
    assert weft.count_workflows(attributes={"customer": "no"}) == 0


def test_start_many_refuses_a_bad_attribute_and_writes_nothing():
    before = snapshot()
    with pytest.raises(InvalidSearchAttributeError, match=r"requests\[1\]"):
        weft.start_many(
            [
                weft.StartRequest("visibility.order", args=["a", 5.0], attributes={"customer": "ok"}),
                weft.StartRequest("visibility.order", args=["b", 5.0], attributes={"items": "three"}),
            ]
        )
    assert snapshot() == before


def test_start_or_signal_starts_its_run_with_the_attributes_given():
    handle, outcome = weft.start_or_signal("visibility.tagged", "done", None, id="sos-attr", attributes={"stage": "a"})
    assert outcome == "started"
    assert [s.id for s in weft.list_workflows(attributes={"stage": "a"})] == [handle.id]
    _, again = weft.start_or_signal("visibility.tagged", "done", None, id="sos-attr", attributes={"stage": "b"})
    assert again == "signalled"  # the run exists: only signalled, its attributes are not touched
    assert weft.count_workflows(attributes={"stage": "b"}) == 0


@pytest.mark.parametrize("start", ["start_or_signal", "start_with_update"])
def test_start_or_message_refuses_a_bad_attribute_and_writes_nothing(start):
    before = snapshot()
    with pytest.raises(InvalidSearchAttributeError, match="stage"):
        getattr(weft, start)("visibility.tagged", "done", None, id="bad-attr", attributes={"stage": 3})
    assert snapshot() == before
