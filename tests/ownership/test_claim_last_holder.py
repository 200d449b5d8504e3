"""WorkflowClaim.last_engine_id: written with engine_id by every statement that makes an engine the
holder, kept by every release (the terminal commit included), so FrozenEngine.wait_for_takeover()
still names the rescuer after it ran the workflow to its end and released the claim."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

import weft_django as weft
from weft_django import client
from weft_django.engine import ownership
from weft_django.models import WorkflowClaim
from weft_django.testing import FrozenEngine, _step_snapshot, expire_claims

pytestmark = pytest.mark.django_db(transaction=True)
TTL, RENEW = timedelta(seconds=30), timedelta(seconds=5)


def claim(workflow_id: str) -> tuple[str | None, str | None]:
    row = WorkflowClaim.objects.get(pk=workflow_id)
    return row.engine_id, row.last_engine_id


def acquire(engine_id: str, *, takeover: bool = False) -> dict[str, int]:
    got = ownership.acquire(engine_id, limit=10, ttl=TTL, renew_interval=RENEW, using="default", takeover=takeover)
    return {wid: epoch for wid, (epoch, _) in got.items()}


def frozen_as(engine_id: str, claims: dict[str, int]) -> FrozenEngine:
    """A FrozenEngine over claims ``engine_id`` holds in this process (no subprocess to stop)."""
    engine = SimpleNamespace(alias="default", engine_id=engine_id)
    return FrozenEngine(engine, claims, _step_snapshot(claims, "default"))  # type: ignore[arg-type]


def test_a_new_claim_has_no_last_holder_and_acquire_sets_it_with_the_holder():
    handle = weft.start("tests.signals")
    assert claim(handle.id) == (None, None)
    assert set(acquire("lh-a")) == {handle.id}
    assert claim(handle.id) == ("lh-a", "lh-a")
    # Renewal rewrites the expiry only.
    assert ownership.renew("lh-a", {handle.id: WorkflowClaim.objects.get(pk=handle.id).epoch}, TTL, "default") == set()
    assert claim(handle.id) == ("lh-a", "lh-a")


def test_takeovers_set_it_to_the_new_holder_and_a_release_keeps_it():
    handle = weft.start("tests.signals")
    acquire("lh-a")
    expire_claims("lh-a")
    taken = acquire("lh-b", takeover=True)  # an expired holder's claim
    assert set(taken) == {handle.id}
    assert claim(handle.id) == ("lh-b", "lh-b")
    got = ownership.take_over_from_others("lh-c", limit=10, ttl=TTL, using="default")  # lease / "none" start-up
    assert {wid: previous for wid, (_, previous) in got.items()} == {handle.id: "lh-b"}
    assert claim(handle.id) == ("lh-c", "lh-c")
    ownership.release("lh-c", {handle.id: got[handle.id][0]}, "default")  # a drain: holder cleared, epoch kept
    row = WorkflowClaim.objects.get(pk=handle.id)
    assert (row.engine_id, row.last_engine_id, row.epoch) == (None, "lh-c", got[handle.id][0])


def test_a_delayed_start_fired_by_an_engine_sets_it(weft_clock):
    handle = weft.start("tests.sum", args=[1, 2], start_after="1s")
    weft_clock.advance(2)
    assert set(ownership.fire_delayed_starts("lh-d", limit=10, ttl=TTL, using="default")) == {handle.id}
    assert claim(handle.id) == ("lh-d", "lh-d")


def test_the_terminal_commit_clears_the_holder_but_keeps_the_last_holder(weft_run_until_idle):
    handle = weft.start("tests.sum", args=[2, 3])
    weft_run_until_idle(engine_id="lh-finisher")
    assert handle.result(timeout=5) == {"total": 5}
    assert claim(handle.id) == (None, "lh-finisher")
    assert not WorkflowClaim.objects.get(pk=handle.id).runnable


def test_wait_for_takeover_names_a_rescuer_that_already_finished_the_workflow(weft_run_until_idle):
    """The race CI hit: the rescuer took the claim over and ran the workflow to its end (releasing the
    claim) before wait_for_takeover() first looked."""
    handle = weft.start("tests.sum", args=[4, 5])
    frozen = frozen_as("lh-zombie", acquire("lh-zombie"))
    expire_claims("lh-zombie")
    weft_run_until_idle(engine_id="lh-rescuer")  # takes the expired claim over, finishes, releases it
    assert handle.result(timeout=5) == {"total": 9}
    assert claim(handle.id) == (None, "lh-rescuer")
    assert frozen.wait_for_takeover(timeout=1) == {handle.id: "lh-rescuer"}


def test_wait_for_takeover_names_no_engine_when_a_transition_alone_moved_the_epoch():
    handle = weft.start("tests.signals")
    frozen = frozen_as("lh-zombie-2", acquire("lh-zombie-2"))
    weft.get_handle(handle.id).cancel()  # a new epoch, no holder: last_engine_id still names the zombie
    assert claim(handle.id) == (None, "lh-zombie-2")
    assert frozen.wait_for_takeover(timeout=1) == {handle.id: None}


def test_the_one_statement_start_still_covers_every_claim_column():
    """client._build_start_statement falls back to the ORM (several round trips) when the claim model
    has a column it does not name: the new column must be in its list."""
    assert {field.column for field in WorkflowClaim._meta.concrete_fields} == client._CLAIM_COLUMNS


@pytest.mark.postgres
def test_a_start_over_a_leftover_claim_row_clears_the_last_holder():
    WorkflowClaim.objects.create(workflow_id="lh-leftover", epoch=1, last_engine_id="lh-gone", runnable=False)
    weft.start("tests.signals", id="lh-leftover")
    row = WorkflowClaim.objects.get(pk="lh-leftover")
    assert (row.engine_id, row.last_engine_id, row.runnable) == (None, None, True)
    assert row.epoch > 1


@pytest.mark.postgres
def test_the_column_is_not_indexed_so_renewals_stay_hot():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, WorkflowClaim._meta.db_table)
    assert not [name for name, info in constraints.items() if "last_engine_id" in (info["columns"] or [])]


def test_the_claim_admin_shows_the_last_holder_of_a_released_claim(admin_client):
    held, released = weft.start("tests.signals", id="lh-held"), weft.start("tests.signals", id="lh-released")
    epochs = acquire("lh-admin-engine")
    ownership.release("lh-admin-engine", {released.id: epochs[released.id]}, "default")
    response = admin_client.get("/admin/weft_django/workflowclaim/")
    assert response.status_code == 200
    rows = {row.workflow_id: row for row in response.context["cl"].result_list}
    admin = response.context["cl"].model_admin
    assert admin.last_holder_display(rows[released.id]) == "lh-admin-engine"
    assert admin.last_holder_display(rows[held.id]) == "-"  # held: the engine column names it
    assert "last held by" in response.content.decode().lower()
