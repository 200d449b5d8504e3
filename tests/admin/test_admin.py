"""The admin pages through Django's test client: every page renders, the ownership columns and
filters read the claim table, the changelist's query count does not grow with its rows, engine-owned
rows cannot be added, edited or deleted, and the custom views check permissions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import weft_django as weft
from weft_django.models import BufferedSignal, Engine, PendingUpdate, Timer, Workflow, WorkflowClaim
from weft_django.status import TimerKind
from weft_django.store import engines
from weft_django.store.clock import db_clock, db_now

ADMIN = "/admin/weft_django"
READ_ONLY_MODELS = ("workflowclaim", "engine", "timer", "bufferedsignal", "pendingupdate")


@weft.workflow(name="admin_tests.waits")
def waits(ctx, *args, **kwargs):
    yield ctx.wait_for_signal("go")


def hold(workflow_id: str, engine_id: str = "engine-x", expires_in: float = 30.0) -> None:
    """Test set-up: make ``engine_id`` the holder of ``workflow_id``'s claim (what acquire() writes)."""
    if not Engine.objects.filter(id=engine_id).exists():
        engines.register_engine(engine_id, "workflow-lease", "default")
    now = db_clock()
    WorkflowClaim.objects.filter(pk=workflow_id).update(
        engine_id=engine_id, claimed_at=now, expires_at=now + timedelta(seconds=expires_in)
    )


@pytest.fixture
def runs(db):
    """owned (held, unexpired), lapsed (held, expired 5 s ago), free (running, unowned), done (completed)."""
    for workflow_id in ("owned", "lapsed", "free", "done"):
        weft.start("admin_tests.waits", id=workflow_id, args=[1, "two"], kwargs={"amount": "12.00"})
    hold("owned")
    hold("lapsed", expires_in=-5)
    now = db_now()
    Workflow.objects.filter(pk="done").update(status="completed", result='{"ok": true}', finished_at=now)
    return ["owned", "lapsed", "free", "done"]


def changelist_ids(response) -> list[str]:
    return [row.pk for row in response.context["cl"].result_list]


@pytest.fixture
def viewer(db, django_user_model):
    """A staff user who may view every weft model and do nothing else."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="weft_django", codename__startswith="view_")
    )
    return user


@pytest.fixture
def viewer_client(viewer) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


# ------------------------------------------------------------------------------------------ pages


def test_every_page_renders(admin_client, runs):
    weft.signal("free", "go", {"n": 1})
    Timer.objects.create(
        workflow_id="free", run_id=Workflow.objects.get(pk="free").run_id, kind=TimerKind.SLEEP, seq=0, fire_at=db_now()
    )
    update = PendingUpdate.objects.create(
        workflow_id="free",
        run_id=Workflow.objects.get(pk="free").run_id,
        name="set_note",
        payload='"hi"',
        created_at=db_now(),
    )
    pages = [
        "/admin/",
        f"{ADMIN}/",
        f"{ADMIN}/workflow/",
        f"{ADMIN}/workflow/ownership/",
        f"{ADMIN}/workflow/ownership/?refresh=5",
        f"{ADMIN}/workflow/terminal/",
        *(f"{ADMIN}/workflow/{workflow_id}/change/" for workflow_id in runs),
        *(f"{ADMIN}/{model}/" for model in READ_ONLY_MODELS),
        f"{ADMIN}/workflowclaim/owned/change/",
        f"{ADMIN}/engine/engine-x/change/",
        f"{ADMIN}/timer/{Timer.objects.get().pk}/change/",
        f"{ADMIN}/bufferedsignal/{BufferedSignal.objects.get().pk}/change/",
        f"{ADMIN}/pendingupdate/{update.pk}/change/",
    ]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page


def test_changelist_shows_owner_epoch_and_highlights_lapsed_claims(admin_client, runs):
    response = admin_client.get(f"{ADMIN}/workflow/")
    html = response.content.decode()
    epoch = WorkflowClaim.objects.get(pk="owned").epoch
    assert "engine-x" in html and f">{epoch}<" in html
    assert 'class="weft-lapsed"' in html and "lapsed 5" in html  # "lapsed 5.0 s ago"
    assert 'weft-badge weft-status-running">Running<' in html
    assert 'weft-status-completed">Completed<' in html
    assert "weft_django/admin.css" in html
    assert f'href="{ADMIN}/workflow/ownership/"' in html and f'href="{ADMIN}/workflow/terminal/"' in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ownership=owned", {"owned"}),
        ("ownership=lapsed", {"lapsed"}),
        ("ownership=unowned", {"free", "done"}),
        ("state=active", {"owned", "lapsed", "free"}),
        ("state=terminal", {"done"}),
        ("status__exact=completed", {"done"}),
        ("workflow_type=admin_tests.waits", {"owned", "lapsed", "free", "done"}),
        ("q=laps", {"lapsed"}),
        ("ownership=unowned&state=active", {"free"}),
    ],
)
def test_changelist_filters(admin_client, runs, query, expected):
    response = admin_client.get(f"{ADMIN}/workflow/?{query}")
    assert response.status_code == 200
    assert set(changelist_ids(response)) == expected


def test_date_hierarchy_drills_down_by_created_at(admin_client, runs):
    today = db_now().date()
    response = admin_client.get(f"{ADMIN}/workflow/?created_at__year={today.year}&created_at__month={today.month}")
    assert set(changelist_ids(response)) == set(runs)


def count_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_changelist_query_count_does_not_grow_with_rows(admin_client, runs, django_assert_max_num_queries):
    url = f"{ADMIN}/workflow/"
    few = count_queries(admin_client, url)
    for i in range(40):
        weft.start("admin_tests.waits", id=f"more-{i}")
        if i % 2:
            hold(f"more-{i}")
    assert count_queries(admin_client, url) == few
    # session, user, the clock, the page of rows with their claims and last steps (subqueries),
    # one COUNT, the date hierarchy and the workflow-type filter.
    with django_assert_max_num_queries(10):
        admin_client.get(url)
    with django_assert_max_num_queries(10):
        admin_client.get(f"{url}?ownership=lapsed")


def test_ownership_and_engine_pages_query_counts_are_flat(admin_client, runs, django_assert_max_num_queries):
    for i in range(20):
        weft.start("admin_tests.waits", id=f"more-{i}")
        hold(f"more-{i}", engine_id=f"engine-{i % 4}")
    for url in (f"{ADMIN}/workflow/ownership/", f"{ADMIN}/engine/", f"{ADMIN}/workflowclaim/", f"{ADMIN}/timer/"):
        with django_assert_max_num_queries(12):
            assert admin_client.get(url).status_code == 200


def test_ownership_view_lists_engines_and_claims(admin_client, runs):
    hold("free", engine_id="engine-dead", expires_in=300.0)  # dormant: renewed with ten TTLs (ADR 0014)
    Engine.objects.filter(id="engine-dead").update(heartbeat_at=db_clock() - timedelta(minutes=10))
    response = admin_client.get(f"{ADMIN}/workflow/ownership/")
    html = response.content.decode()
    engines = {row["row"].engine.id: row["row"] for row in response.context["engines"]}
    assert engines["engine-x"].state == "alive" and engines["engine-x"].claims_held == 2
    assert engines["engine-x"].claims_lapsed == 1
    assert engines["engine-dead"].state == "dead" and engines["engine-dead"].claims_held == 1
    assert engines["engine-dead"].claims_lapsed == 1  # unexpired, but its engine is silent (ADR 0014)
    claims = {item["row"].workflow_id: item["row"] for item in response.context["claims"]}
    assert set(claims) == {"owned", "lapsed", "free"}
    assert claims["lapsed"].lapsed and claims["free"].lapsed and not claims["owned"].lapsed
    summary = response.context["summary"]
    assert (summary.held, summary.lapsed, summary.engines_alive, summary.engines_dead) == (3, 2, 1, 1)
    assert "weft-state-dead" in html and "weft-row-lapsed" in html


def test_terminal_view_counts_failures_and_retention(admin_client, runs):
    now = db_now()
    weft.start("admin_tests.waits", id="old-failure")
    Workflow.objects.filter(pk="old-failure").update(
        status="failed",
        finished_at=now - timedelta(days=40),
        error={"type": "ValueError", "message": "bad input", "traceback": "Traceback ..."},
    )
    weft.start("admin_tests.waits", id="new-failure")
    Workflow.objects.filter(pk="new-failure").update(
        status="failed", finished_at=now, error={"type": "KeyError", "message": "'sku'"}
    )
    response = admin_client.get(f"{ADMIN}/workflow/terminal/")
    assert response.status_code == 200
    today = response.context["bars"][0]
    assert today["counts"] == {"completed": 1, "failed": 1, "cancelled": 0, "timed_out": 0}
    assert response.context["window_total"] == 2  # the 40-day-old failure is outside the window
    assert [item["workflow"].id for item in response.context["failures"]] == ["new-failure", "old-failure"]
    plan = {item["row"].status: item["row"] for item in response.context["plan"]}
    assert plan["failed"].due_now == 1  # 40 days > 30 days of retention
    assert plan["completed"].due_now == 0 and plan["completed"].next_due_at is not None
    assert response.context["removals"][0]["id"] == "old-failure" and response.context["removals"][0]["due"]
    assert "KeyError: &#x27;sku&#x27;" in response.content.decode()


def test_change_page_shows_payloads_claim_and_mailbox(admin_client, runs):
    weft.signal("owned", "go", {"approved": True}, signal_id="sig-1")
    run_id = Workflow.objects.get(pk="owned").run_id
    PendingUpdate.objects.create(
        workflow_id="owned",
        run_id=run_id,
        name="set_note",
        payload='"x"',
        status="rejected",
        issues=[{"message": "note must be a string", "path": None}],
        created_at=db_now(),
        completed_at=db_now(),
    )
    response = admin_client.get(f"{ADMIN}/workflow/owned/change/")
    html = response.content.decode()
    assert (
        "{&#x27;args&#x27;: [1, &#x27;two&#x27;], &#x27;kwargs&#x27;: {&#x27;amount&#x27;: &#x27;12.00&#x27;}}" in html
    )
    assert "engine-x" in html and "in 2" in html  # claim expiry "in 29 s"
    assert "sig-1" in html and "{&#x27;approved&#x27;: True}" in html
    assert "rejected: note must be a string" in html
    assert 'id="weft-timeline"' in html
    done = admin_client.get(f"{ADMIN}/workflow/done/change/").content.decode()
    assert "{&#x27;ok&#x27;: True}" in done


def test_ids_with_slashes_and_unknown_ids(admin_client, db):
    weft.start("admin_tests.waits", id="parent/0")
    response = admin_client.get(f"{ADMIN}/workflow/parent_2F0/change/")
    assert response.status_code == 200 and "parent/0" in response.content.decode()
    assert admin_client.get(f"{ADMIN}/workflow/nope/change/", follow=True).status_code == 200  # "doesn't exist"


# --------------------------------------------------------------------------- read-only + permissions


@pytest.mark.parametrize("model", ["workflow", *READ_ONLY_MODELS])
def test_nobody_adds_changes_or_deletes_engine_owned_rows(admin_client, runs, model):
    assert admin_client.get(f"{ADMIN}/{model}/add/").status_code == 403
    response = admin_client.get(f"{ADMIN}/{model}/")
    assert "delete_selected" not in response.content.decode()


def test_workflow_rows_cannot_be_edited_or_deleted(admin_client, runs):
    before = Workflow.objects.get(pk="owned")
    response = admin_client.post(f"{ADMIN}/workflow/owned/change/", {"status": "completed"})
    assert response.status_code == 403
    assert admin_client.post(f"{ADMIN}/workflow/owned/delete/", {"post": "yes"}).status_code == 403
    assert Workflow.objects.get(pk="owned").status == before.status


def test_viewer_sees_pages_but_no_actions(viewer_client, runs):
    response = viewer_client.get(f"{ADMIN}/workflow/")
    assert response.status_code == 200
    assert "cancel_workflows" not in response.content.decode()
    assert viewer_client.get(f"{ADMIN}/workflow/ownership/").status_code == 200
    assert viewer_client.get(f"{ADMIN}/workflow/terminal/").status_code == 200
    page = viewer_client.get(f"{ADMIN}/workflow/owned/change/")
    assert page.status_code == 200 and page.context["object_actions"] == []


def test_staff_without_view_permission_is_refused(db, django_user_model):
    user = django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    for url in (f"{ADMIN}/workflow/", f"{ADMIN}/workflow/ownership/", f"{ADMIN}/workflow/terminal/"):
        assert client.get(url).status_code == 403


def test_anonymous_users_are_sent_to_login(client, db):
    for url in (f"{ADMIN}/workflow/ownership/", f"{ADMIN}/workflow/terminal/", f"{ADMIN}/workflow/x/act/cancel/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
