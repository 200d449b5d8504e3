"""manage.py weft list --where, fork and bulk (issue 19): filters, pages, confirmation, bad input."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command

import weft_django as weft
from tests.testapp import visibility_workflows
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def weft_cli(*args: str) -> str:
    out = StringIO()
    call_command("weft", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def snapshot() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


@pytest.fixture
def orders():
    a = weft.start("visibility.order", args=["a", 1.0], attributes={"customer": "acme", "items": 2}).id
    b = weft.start("visibility.order", args=["b", 1.0], attributes={"customer": "beta", "items": 9}).id
    return a, b


def test_list_where_filters_attributes_and_builtins(orders):
    a, b = orders
    text = weft_cli("list", "--where", "customer=acme")
    assert a in text and b not in text and '"customer": "acme"' in text
    found = json.loads(weft_cli("list", "--where", "items__gte=5", "--where", "status=running", "--json"))
    assert [w["id"] for w in found["workflows"]] == [b]
    assert found["next_cursor"] is None
    first = json.loads(weft_cli("list", "--where", "workflow_type=visibility.order", "--limit", "1", "--json"))
    second = json.loads(weft_cli("list", "--cursor", first["next_cursor"], "--limit", "1", "--json"))
    assert [first["workflows"][0]["id"], second["workflows"][0]["id"]] == [b, a]
    assert "No workflows match." in weft_cli("list", "--where", "customer=nobody")
    assert a in weft_cli("list", "--where", "created_after=2000-01-01T00:00Z")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("list", "--where", "customer"), "KEY=VALUE"),
        (("list", "--where", "nosuch=1"), "InvalidFilterError"),
        (("list", "--where", "items__gte=lots"), "declared as int"),
        (("list", "--cursor", "garbage"), "not a cursor"),
        (("fork", "no-such", "--from-step", "0"), "WorkflowNotFoundError"),
        (("bulk", "cancel", "--where", "customer=acme", "--expected-count", "5", "--yes"), "BulkCountChangedError"),
    ],
)
def test_bad_input_is_refused_and_nothing_changes(orders, args, words):
    before = snapshot()
    with pytest.raises(CommandError, match=words):
        weft_cli(*args)
    assert snapshot() == before


def test_fork_command():
    visibility_workflows.FORK_VERSION["value"] = "v1"
    source = weft.start("visibility.failing", args=["cli"])
    run_until_idle()
    try:
        visibility_workflows.FORK_VERSION["value"] = "v2"
        text = weft_cli("fork", source.id, "--from-step", "1", "--new-id", "cli-fork")
        assert 'new workflow "cli-fork"' in text
        run_until_idle()
        assert weft.get_handle("cli-fork").result(timeout="5s") == "a:v1"
        with pytest.raises(CommandError, match="InvalidForkError"):
            weft_cli("fork", source.id, "--from-step", "7")
    finally:
        visibility_workflows.FORK_VERSION["value"] = "v1"


def test_bulk_cancel_asks_and_reports(orders):
    a, b = orders
    with pytest.raises(CommandError, match="pass --yes"):  # stdin is not a terminal
        weft_cli("bulk", "cancel", "--where", "customer=acme")
    assert Workflow.objects.get(pk=a).status == "running"
    text = weft_cli("bulk", "cancel", "--where", "customer=acme", "--reason", "cli", "--yes")
    assert "cancel: 1 of 1 workflow(s)" in text
    assert Workflow.objects.get(pk=a).status == "cancelled"
    assert "No workflows to cancel match" in weft_cli("bulk", "cancel", "--where", "customer=acme", "--yes")
    result = json.loads(weft_cli("bulk", "purge", "--where", "customer=acme", "--expected-count", "1", "--json"))
    assert result["changed"] == 1
    assert list(Workflow.objects.values_list("pk", flat=True)) == [b]
