"""Tests of the shop's order pipeline: how a project tests its own workflows with weft_django.testing.

    DJANGO_SETTINGS_MODULE=example_project.test_settings pytest example_project

The fixtures (``weft_run_until_idle``, ``weft_clock``, ``weft_engines``) come from the pytest plugin
that installing weft-django registers; see docs/testing.md.
"""

from __future__ import annotations

import pytest

import weft_django as weft
from example_project.shop.workflows import order_pipeline
from weft_django.models import Step, Workflow
from weft_django.testing import wait_for

# Engines use their own database connections, so the workflow rows must be committed: transactional tests.
pytestmark = pytest.mark.django_db(transaction=True)
EXPECTED = {"order_id": 42, "reservation": "res_42", "charge_id": "ch_42", "receipt": "receipt_42"}


def test_an_order_runs_end_to_end_without_waiting_for_its_timer(weft_run_until_idle, weft_clock):
    handle = order_pipeline.start(42, "12.00")
    weft_run_until_idle()  # reserves stock, charges the card, then parks on the 1 s cooling-off timer
    charged = Step.objects.filter(workflow_id=handle.id, name="shop.charge_card", status="completed")
    assert charged.count() == 1
    weft_clock.advance(1)  # the timer is due now: no real waiting
    weft_run_until_idle()
    assert handle.result(timeout=5) == EXPECTED
    assert list(
        Step.objects.filter(workflow_id=handle.id, kind="activity").order_by("seq").values_list("name", flat=True)
    ) == [
        "shop.reserve_stock",
        "shop.charge_card",
        "shop.send_receipt",
    ]


def test_a_non_json_amount_is_refused_before_anything_is_stored():
    from decimal import Decimal

    handle = order_pipeline.start(7, Decimal("9.99"))  # Decimal round-trips exactly through the codec
    assert handle.describe()["status"] == "running"
    with pytest.raises(weft.PayloadNotSerializableError, match=r"args\[1\]"):
        order_pipeline.start(8, object())
    assert Workflow.objects.filter(workflow_type="shop.order_pipeline").count() == 1  # nothing stored for #8


@pytest.mark.subprocess
def test_an_order_survives_its_engine_freezing(weft_engines):
    """Failover: the first engine freezes mid-order; another takes the order over and finishes it; the
    frozen engine, once thawed, has every late write refused."""
    fast = {"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "500ms"}
    first = weft_engines("shop-a", weft=fast)
    handle = order_pipeline.start(42, "12.00")
    wait_for(first.claims, timeout=30, message="engine shop-a to pick the order up")
    frozen = first.freeze_past_claim()  # SIGSTOP, then wait out the claim's TTL + grace on the database clock
    weft_engines("shop-b", weft=fast)
    assert frozen.wait_for_takeover() == {handle.id: "shop-b"}
    assert handle.result(timeout=60) == EXPECTED
    frozen.assert_writes_refused(timeout=60)
