"""list_workflows / count_workflows with filter values and cursors at the edges of what the database
can take: each is refused with InvalidFilterError before any query, on PostgreSQL and SQLite (a huge
int, NUL or a lone surrogate in text, a moment outside years 1-9999 in UTC, a tampered cursor)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

import weft_django as weft
from weft_django.exceptions import InvalidFilterError, InvalidSearchAttributeError
from weft_django.models import Workflow, WorkflowAttribute
from weft_django.testing import run_until_idle
from weft_django.visibility import parse_where

pytestmark = pytest.mark.django_db(transaction=True)

LATE = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))  # 10000-01-01 04:00 in UTC
EARLY = datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5)))  # before year 1 in UTC


def cursor_of(*items: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(items)).encode()).decode().rstrip("=")


EDGE_FILTERS = [
    ({"attributes": {"items": 10**400}}, "finite number"),
    ({"attributes": {"amount__gte": -(10**400)}}, "finite number"),
    ({"attributes": {"items__in": [1, 10**400]}}, "finite number"),
    ({"attributes": {"customer": "a\x00b"}}, "NUL"),
    ({"attributes": {"tags": "\x00"}}, "NUL"),
    ({"attributes": {"customer__in": ["ok", "\ud800"]}}, "surrogate"),
    ({"attributes": {"placed_at__gte": LATE}}, "years 1-9999"),
    ({"attributes": {"placed_at__lt": EARLY}}, "years 1-9999"),
    ({"created_after": LATE}, "years 1-9999"),
    ({"ended_before": EARLY}, "years 1-9999"),
    ({"id_prefix": "\ud800"}, "non-empty string"),
    ({"workflow_type": "x\ud800"}, "non-empty string"),
]


@pytest.mark.parametrize(("filters", "words"), EDGE_FILTERS)
def test_edge_values_are_refused_before_any_query(filters, words, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidFilterError, match=words):
        weft.list_workflows(**filters)
    with django_assert_num_queries(0), pytest.raises(InvalidFilterError, match=words):
        weft.count_workflows(**filters)


@pytest.mark.parametrize(
    "cursor",
    [
        cursor_of("2026-01-01T00:00:00+00:00", "a\x00b"),
        cursor_of("2026-01-01T00:00:00+00:00", "\ud800"),
        cursor_of(LATE.isoformat(), "x"),
        cursor_of(EARLY.isoformat(), "x"),
    ],
)
def test_a_tampered_cursor_is_refused_before_any_query(cursor, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidFilterError, match="not a cursor"):
        weft.list_workflows(cursor=cursor)


def test_values_inside_the_edges_still_filter():
    weft.start("visibility.order", args=["a", 1.0], id="e-1", attributes={"items": 3, "customer": "é"})
    assert [s.id for s in weft.list_workflows(attributes={"items__lt": 2**60, "customer": "é"})] == ["e-1"]
    assert weft.count_workflows(attributes={"placed_at__lt": datetime(9999, 12, 31, tzinfo=UTC)}) == 0
    assert weft.count_workflows(created_before=datetime(9999, 12, 31, 23, 59, tzinfo=UTC)) == 1
    page = weft.list_workflows(limit=1)
    assert weft.list_workflows(cursor=cursor_of(page.workflows[0].created_at.isoformat(), "e-1")).workflows == []


def test_a_float_attribute_beyond_a_float8_is_an_invalid_attribute_not_an_overflow():
    before = Workflow.objects.count()
    with pytest.raises(InvalidSearchAttributeError, match="finite"):  # was OverflowError
        weft.start("visibility.order", args=["a", 1.0], attributes={"amount": 10**400})
    assert Workflow.objects.count() == before
    handle = weft.start("visibility.bad_attribute", args=["amount", 10**400])
    run_until_idle()
    row = Workflow.objects.get(pk=handle.id)
    assert row.status == "failed"
    assert row.error["type"] == "InvalidSearchAttributeError", row.error["type"]
    assert not WorkflowAttribute.objects.filter(workflow_id=handle.id).exists()


@pytest.mark.parametrize(
    "attributes",
    [{"amount": 10**5000}, {"items": 10**5000}, {"customer": 10**5000}, {"tags": 10**5000}, {10**5000: 1}],
    ids=["float", "int", "str", "keywords", "name"],
)
def test_an_int_too_long_for_str_is_an_invalid_attribute(attributes):
    # More digits than sys.get_int_max_str_digits() (4300): the message's repr of it raised ValueError.
    before = Workflow.objects.count()
    with pytest.raises(InvalidSearchAttributeError, match="too large to show"):
        weft.start("visibility.order", args=["a", 1.0], attributes=attributes)
    assert Workflow.objects.count() == before


@weft.workflow(name="edges.region_text", attributes={"region": str})
def region_text(ctx):
    yield ctx.sleep(0)


@weft.workflow(name="edges.region_number", attributes={"region": int})
def region_number(ctx):
    yield ctx.sleep(0)


def test_exists_finds_an_attribute_of_every_kind_its_name_is_declared_with():
    """Two workflows declare "region" with different types: __exists asks whether the name is set,
    whichever column holds its value."""
    weft.start(region_text, id="r-text", attributes={"region": "eu"})
    weft.start(region_number, id="r-number", attributes={"region": 7})
    weft.start(region_text, id="r-unset")
    found = {s.id for s in weft.list_workflows(attributes={"region__exists": True})}
    assert found == {"r-text", "r-number"}, found
    assert {s.id for s in weft.list_workflows(attributes={"region__exists": False})} == {"r-unset"}
    assert weft.count_workflows(attributes={"region__exists": True}) == 2


def test_a_where_value_nested_too_deep_is_a_bad_filter():
    with pytest.raises(InvalidFilterError, match="nested"):
        parse_where(["tags__in=" + "[" * 5_000 + "]" * 5_000])
