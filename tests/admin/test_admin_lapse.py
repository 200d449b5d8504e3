"""A claim whose expiry is still ahead but whose engine went silent (a dormant claim of an evicted
workflow: renewed once per nine TTLs, ADR 0014) shows as lapsed everywhere an operator looks: the
workflow and claim changelists and their filters, the ownership page, ``weft claims``, ``weft list``
and the doctor. Before, every one of them compared the expiry only and called it held for up to ten
TTLs after its engine died."""

from __future__ import annotations

from datetime import timedelta

import pytest

import weft_django as weft
from tests.admin.test_admin import ADMIN, changelist_ids, hold
from tests.admin.test_cli import doctor, levels, weft_cli, weft_json
from weft_django.conf import get_settings
from weft_django.models import Engine
from weft_django.store.clock import db_clock


@pytest.fixture
def dormant(db):
    """ "sleeper": held by engine-gone, expiring in 40 minutes, its engine silent for 10 (past TTL and
    grace); "awake": held by engine-live, expiring in 40 minutes, its engine heartbeating."""
    for workflow_id in ("sleeper", "awake"):
        weft.start("admin_tests.waits", id=workflow_id)
    hold("sleeper", engine_id="engine-gone", expires_in=2400)
    hold("awake", engine_id="engine-live", expires_in=2400)
    assert get_settings().workflow_claim_ttl < timedelta(minutes=5)
    Engine.objects.filter(id="engine-gone").update(heartbeat_at=db_clock() - timedelta(minutes=10))


def test_the_workflow_changelist_calls_a_silent_engines_claim_lapsed(admin_client, dormant):
    assert set(changelist_ids(admin_client.get(f"{ADMIN}/workflow/?ownership=lapsed"))) == {"sleeper"}
    assert set(changelist_ids(admin_client.get(f"{ADMIN}/workflow/?ownership=owned"))) == {"awake"}
    html = admin_client.get(f"{ADMIN}/workflow/").content.decode()
    assert "lapsed: engine silent since 10" in html  # "... since 10.0 min ago"


def test_the_claim_changelist_and_the_ownership_page_agree(admin_client, dormant):
    lapsed = admin_client.get(f"{ADMIN}/workflowclaim/?claim=lapsed")
    assert [claim.workflow_id for claim in lapsed.context["cl"].result_list] == ["sleeper"]
    held = admin_client.get(f"{ADMIN}/workflowclaim/?claim=held")
    assert [claim.workflow_id for claim in held.context["cl"].result_list] == ["awake"]
    assert "lapsed: engine silent since" in admin_client.get(f"{ADMIN}/workflowclaim/").content.decode()
    page = admin_client.get(f"{ADMIN}/workflow/ownership/")
    claims = {item["row"].workflow_id: item["row"].lapsed for item in page.context["claims"]}
    assert claims == {"sleeper": True, "awake": False}
    engines = {row["row"].engine.id: row["row"].claims_lapsed for row in page.context["engines"]}
    assert engines == {"engine-gone": 1, "engine-live": 0}
    assert page.context["summary"].lapsed == 1


def test_the_cli_and_the_doctor_agree(dormant):
    assert {c["workflow_id"]: c["lapsed"] for c in weft_json("claims")} == {"sleeper": True, "awake": False}
    lines = {line.split()[0]: line for line in weft_cli("claims").splitlines()[1:]}
    assert "(lapsed)" in lines["sleeper"] and "(lapsed)" not in lines["awake"]
    listed = {line.split()[0]: line for line in weft_cli("list").splitlines()[1:] if line.strip()}
    assert "(lapsed)" in listed["sleeper"] and "(lapsed)" not in listed["awake"]
    report, ok = doctor()
    assert not ok and levels(report)["lapsed claims"] == "error"
    found = next(c for c in report["checks"] if c["check"] == "lapsed claims")
    [detail] = found["details"]
    assert detail.startswith("sleeper held by engine-gone (epoch ") and "its engine silent for 10" in detail


def test_the_changelists_render_with_invalid_weft_settings_using_the_default_ttl(admin_client, dormant):
    """A broken WEFT setting is ``manage.py check``'s to report; the admin still shows the claims (with
    the default claim TTL for the silent-engine rule)."""
    from django.test import override_settings

    with override_settings(WEFT={"WORKFLOW_CLAIM_TTL": "soon"}):
        for url in (f"{ADMIN}/workflow/?ownership=lapsed", f"{ADMIN}/workflowclaim/?claim=lapsed"):
            response = admin_client.get(url)
            assert response.status_code == 200
            assert [row.pk for row in response.context["cl"].result_list] == ["sleeper"]
        engines = admin_client.get(f"{ADMIN}/engine/")
        assert engines.status_code == 200
        assert "weft-state-dead" in engines.content.decode() and "weft-state-alive" in engines.content.decode()
