"""A bulk operation's result says, per run, what happened to it (docs/visibility.md § Bulk operations):
``changed`` counts the runs this operation changed, ``skipped`` lists those that no longer qualified
at their turn (they ended, were retried, purged or started again meanwhile), each run once."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django import bulk, transitions
from weft_django.models import Workflow
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_retention(settings):
    settings.WEFT = {**getattr(settings, "WEFT", {}), "RETENTION": {"completed": None}}


def _completed(*ids: str) -> None:
    for workflow_id in ids:
        weft.start("visibility.order", args=["purge-me", 1.0], id=workflow_id)
    run_until_idle()
    assert set(Workflow.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"completed"}


def test_bulk_purge_lists_a_run_another_client_purged_meanwhile_as_skipped(monkeypatch, no_retention):
    """Between the batch's read and its purge another client purges "bp-b": bulk_purge reported
    neither changed nor skipped for it (its skipped list was the ids still there after the purge)."""
    _completed("bp-a", "bp-b")
    real = transitions.purge_terminal

    def purge_terminal(ids, **options):
        transitions.purge("bp-b")  # someone else's purge commits first
        return real(ids, **options)

    monkeypatch.setattr(bulk.transitions, "purge_terminal", purge_terminal)
    result = weft.bulk_purge(attributes={"customer": "purge-me"}, expected_count=2)
    assert (result.changed, result.skipped) == (1, ["bp-b"])
    assert not Workflow.objects.filter(pk__in=["bp-a", "bp-b"]).exists()


def test_bulk_purge_does_not_list_a_run_it_purged_as_skipped(monkeypatch, no_retention):
    """A run this purge deleted and that was started again under its id before the result was put
    together was reported twice: counted in changed and listed in skipped."""
    _completed("bq-a", "bq-b")
    real = transitions.purge_terminal

    def purge_terminal(ids, **options):
        purged = real(ids, **options)
        weft.start("visibility.order", args=["someone else", 1.0], id="bq-b")  # a new run, right after
        return purged

    monkeypatch.setattr(bulk.transitions, "purge_terminal", purge_terminal)
    result = weft.bulk_purge(attributes={"customer": "purge-me"}, expected_count=2)
    assert (result.changed, result.skipped) == (2, [])
    assert Workflow.objects.get(pk="bq-b").status in ("pending", "running")
