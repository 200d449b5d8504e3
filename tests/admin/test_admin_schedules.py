"""The Schedule admin through Django's test client: the list, add and change forms that save through
weft.schedule() / ScheduleHandle.update() and turn the library's typed errors into form errors (with
nothing written), the pause / resume / trigger / delete actions, per-action permissions and CSRF."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client

import weft_django as weft
from tests.admin.test_admin import ADMIN
from tests.admin.test_admin_actions import messages_of
from weft_django import schedules
from weft_django.models import Schedule, Workflow

CHANGELIST = f"{ADMIN}/schedule/"
ADD = f"{ADMIN}/schedule/add/"
VALID = {
    "id": "nightly",
    "workflow": "tests.scheduled_run",
    "cron": "30 2 * * *",
    "every": "",
    "timezone": "Europe/Berlin",
    "jitter": "",
    "args": "[]",
    "kwargs": '{"label": "n"}',
    "overlap": "queue",
}


def change_url(schedule_id: str) -> str:
    return f"{ADMIN}/schedule/{schedule_id}/change/"


def act_url(schedule_id: str, action: str) -> str:
    return f"{ADMIN}/schedule/{schedule_id}/act/{action}/"


def snapshot() -> list[dict[str, Any]]:
    """Every schedule row, every column: what an invalid form must leave as it was."""
    return list(Schedule.objects.order_by("pk").values())


def form_errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code  # re-shown, not redirected
    return {name: [str(e) for e in errors] for name, errors in response.context["adminform"].form.errors.items()}


@pytest.fixture
def api_calls(monkeypatch) -> list[tuple[str, Any]]:
    """Record the calls the admin makes to the public API (they still run)."""
    calls: list[tuple[str, Any]] = []
    schedule, update = schedules.schedule, schedules.ScheduleHandle.update

    def spy_schedule(workflow: Any, **kwargs: Any) -> schedules.ScheduleHandle:
        calls.append(("schedule", {"workflow": workflow, **kwargs}))
        return schedule(workflow, **kwargs)

    def spy_update(self: schedules.ScheduleHandle, **kwargs: Any) -> None:
        calls.append(("update", {"id": self.id, **kwargs}))
        update(self, **kwargs)

    monkeypatch.setattr(schedules, "schedule", spy_schedule)
    monkeypatch.setattr(schedules.ScheduleHandle, "update", spy_update)
    return calls


@pytest.fixture
def some(db) -> list[str]:
    """nightly (cron in Berlin, jitter), tick (every hour), held (every 5 m, paused with a note)."""
    weft.schedule("tests.scheduled_run", id="nightly", cron="30 2 * * *", timezone="Europe/Berlin", jitter="5m")
    weft.schedule("tests.scheduled_run", id="tick", every=3600, overlap="allow")
    weft.schedule("tests.scheduled_run", id="held", every="5m").pause(note="ledger migration")
    return ["held", "nightly", "tick"]


# ------------------------------------------------------------------------------------------ the list


def test_list_shows_spec_state_and_fire_times(admin_client, some):
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    rows = {row.pk: row for row in response.context["cl"].result_list}
    assert sorted(rows) == some
    model_admin = response.context["cl"].model_admin
    assert model_admin.spec_display(rows["nightly"]) == "cron 30 2 * * * (Europe/Berlin), jitter < 5 m"
    assert model_admin.spec_display(rows["tick"]) == "every 1h"
    assert model_admin.spec_display(rows["held"]) == "every 5m"
    assert "paused" in model_admin.state_display(rows["held"]) and "ledger migration" in model_admin.state_display(
        rows["held"]
    )
    assert "active" in model_admin.state_display(rows["tick"])
    assert model_admin.next_fire_display(rows["held"]) == "-"
    assert model_admin.next_fire_display(rows["tick"]).startswith("<span") and "in " in model_admin.next_fire_display(
        rows["tick"]
    )
    html = response.content.decode()
    for text in ("cron 30 2 * * * (Europe/Berlin)", "every 1h", "Allow", "Skip", "paused"):
        assert text in html
    for action in ("pause_schedules", "resume_schedules", "trigger_schedules", "delete_selected"):
        assert f'value="{action}"' in html
    paused = admin_client.get(CHANGELIST, {"paused__exact": "1"})
    assert [row.pk for row in paused.context["cl"].result_list] == ["held"]
    found = admin_client.get(CHANGELIST, {"q": "nigh"})
    assert [row.pk for row in found.context["cl"].result_list] == ["nightly"]


def test_change_page_shows_what_the_engines_keep(admin_client, some):
    weft.get_schedule("tick").trigger()
    response = admin_client.get(change_url("tick"))
    assert response.status_code == 200
    html = response.content.decode()
    run = Workflow.objects.get(schedule_id="tick")
    assert run.pk in html  # the active run, linked
    assert "Next fire times (UTC)" in html
    described = weft.get_schedule("tick").describe()
    first = described["next_fire_times"][0].strftime("%Y-%m-%d %H:%M:%S")
    assert first in html
    assert [a["action"] for a in response.context["object_actions"]] == ["pause", "trigger"]
    held = admin_client.get(change_url("held"))
    assert [a["action"] for a in held.context["object_actions"]] == ["resume", "trigger"]
    form = response.context["adminform"].form
    assert form.initial["every"] == "3600" and form.initial["overlap"] == "allow"
    assert "id" not in form.fields  # the primary key is read-only


# ------------------------------------------------------------------------------------------- adding


@pytest.mark.django_db(transaction=True)
def test_add_creates_through_the_api_and_it_fires(admin_client, api_calls, weft_clock, weft_run_until_idle):
    assert admin_client.get(ADD).status_code == 200
    response = admin_client.post(ADD, VALID, follow=True)
    assert response.redirect_chain == [(CHANGELIST, 302)]
    assert messages_of(response)[0].startswith("The schedule “")
    assert api_calls == [
        (
            "schedule",
            {
                "workflow": "tests.scheduled_run",
                "id": "nightly",
                "cron": "30 2 * * *",
                "every": None,
                "timezone": "Europe/Berlin",
                "jitter": None,
                "args": [],
                "kwargs": {"label": "n"},
                "overlap": "queue",
                "backfill": False,
            },
        )
    ]
    described = weft.get_schedule("nightly").describe()
    assert described["workflow_type"] == "tests.scheduled_run" and described["overlap"] == "queue"
    assert described["kwargs"] == {"label": "n"} and described["paused"] is False
    berlin = [moment.astimezone(ZoneInfo("Europe/Berlin")) for moment in described["next_fire_times"]]
    assert [(m.hour, m.minute) for m in berlin] == [(2, 30)] * 5  # 02:30 Berlin time, DST or not
    assert LogEntry.objects.get(object_id="nightly").action_flag == ADDITION

    # An interval typed as a duration, then the first occurrence fires one period later.
    interval = {**VALID, "id": "tick", "cron": "", "every": "1m", "timezone": "UTC", "args": '["from-admin"]'}
    interval["kwargs"] = ""
    assert admin_client.post(ADD, interval).status_code == 302
    row = Schedule.objects.get(pk="tick")
    assert row.every == 60 and row.cron is None and row.next_fire_at is not None
    weft_clock.advance_to(row.next_fire_at + timedelta(seconds=1))
    weft_run_until_idle()
    nominal = row.next_nominal_at.astimezone(UTC)
    run = Workflow.objects.get(schedule_id="tick")
    assert run.pk == f"tick@{nominal:%Y-%m-%dT%H:%M:%SZ}" and run.status == "completed"
    assert weft.get_handle(run.pk).result() == {"id": run.pk, "label": "from-admin"}


BAD_INPUTS = [
    # (form changes, field with the error, words of weft's message)
    ({"cron": "61 * * * *"}, "cron", "is not a valid cron expression"),
    ({"cron": "* * *"}, "cron", "has 3 field(s)"),
    ({"cron": "R * * * *"}, "cron", '"R" (random)'),
    ({"cron": "0 0 30 2 *"}, "cron", "never matches a date"),
    ({"workflow": "tests.no_such_workflow"}, "workflow", 'No workflow "tests.no_such_workflow" is registered'),
    ({"timezone": "Europe/Berlinn"}, "timezone", 'Did you mean "Europe/Berlin"?'),
    ({"args": "[1, 2"}, "args", "args is not valid JSON"),
    ({"args": '{"a": 1}'}, "args", "args must be a list or tuple"),
    ({"args": "[NaN]"}, "args", "NaN"),
    ({"kwargs": "[1]"}, "kwargs", "kwargs must be a dict with str keys"),
    ({"kwargs": '{"x": {"$weft": "decimal", "v": "abc"}}'}, "kwargs", "kwargs cannot be used"),
    ({"cron": "", "every": "-5"}, "every", "every must be a whole number of seconds, at least 1"),
    ({"cron": "", "every": "-5m"}, "every", "every must be a duration"),
    ({"cron": "", "every": "1.5"}, "every", "every must be a whole number of seconds"),
    ({"cron": "", "every": "soon"}, "every", "every must be a duration"),
    ({"jitter": "-1"}, "jitter", "jitter must be between 0 and"),
    ({"jitter": "-2m"}, "jitter", "jitter must be a duration"),
    ({"every": "60"}, "__all__", "Pass exactly one of cron"),
    ({"cron": ""}, "__all__", "neither was given"),
    ({"overlap": "sometimes"}, "overlap", "Select a valid choice"),
    ({"id": "bad\nid"}, "id", "control characters"),
    ({"id": "x" * 201}, "id", "at most 200 characters"),
    ({"workflow": ""}, "workflow", "This field is required"),
]


@pytest.mark.parametrize(("changes", "field", "words"), BAD_INPUTS, ids=[f"{c}" for c, _, _ in BAD_INPUTS])
def test_add_refuses_bad_input_as_form_errors_and_writes_nothing(admin_client, some, api_calls, changes, field, words):
    before = snapshot()
    response = admin_client.post(ADD, {**VALID, "id": "new-one", **changes})
    errors = form_errors(response)
    assert field in errors, errors
    assert any(words in message for message in errors[field]), errors
    assert snapshot() == before
    assert api_calls == []
    assert not LogEntry.objects.exists()


def test_add_refuses_an_existing_id(admin_client, some, api_calls):
    before = snapshot()
    errors = form_errors(admin_client.post(ADD, {**VALID, "id": "tick"}))
    assert errors == {"id": ['A schedule "tick" already exists; open it to change it.']}
    assert snapshot() == before and api_calls == []


# ------------------------------------------------------------------------------------------ editing


def test_edit_goes_through_update_and_keeps_the_pause(admin_client, some, api_calls):
    before = Schedule.objects.get(pk="held")
    data = {**VALID, "cron": "0 3 * * 1-5", "every": "", "timezone": "America/New_York", "overlap": "skip"}
    data.pop("id")
    response = admin_client.post(change_url("held"), data, follow=True)
    assert response.redirect_chain == [(CHANGELIST, 302)]
    assert api_calls == [
        (
            "update",
            {
                "id": "held",
                "workflow": "tests.scheduled_run",
                "cron": "0 3 * * 1-5",
                "every": None,
                "timezone": "America/New_York",
                "jitter": None,
                "args": [],
                "kwargs": {"label": "n"},
                "overlap": "skip",
                "backfill": False,
            },
        )
    ]
    described = weft.get_schedule("held").describe()
    assert (described["cron"], described["every"], described["timezone"]) == ("0 3 * * 1-5", None, "America/New_York")
    assert described["paused"] is True and described["note"] == "ledger migration"  # still paused
    after = Schedule.objects.get(pk="held")
    assert after.created_at == before.created_at and after.next_fire_at is None
    entry = LogEntry.objects.get(object_id="held")
    assert entry.action_flag == CHANGE and "Cron" in entry.get_change_message()


def test_saving_unchanged_keeps_the_next_fire_time(admin_client, some):
    before = Schedule.objects.get(pk="tick")
    form = admin_client.get(change_url("tick")).context["adminform"].form
    data = {name: form.initial.get(name) for name in form.fields}
    data = {name: ("" if value is None else value) for name, value in data.items() if value is not False}
    assert admin_client.post(change_url("tick"), data).status_code == 302
    after = Schedule.objects.get(pk="tick")
    assert (after.next_fire_at, after.next_nominal_at, after.updated_at) == (
        before.next_fire_at,
        before.next_nominal_at,
        before.updated_at,
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cron": "nonsense"}, "cron"),
        ({"workflow": "nope"}, "workflow"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"kwargs": "{"}, "kwargs"),
        ({"cron": "", "every": "-1"}, "every"),
    ],
)
def test_edit_refuses_bad_input_and_changes_nothing(admin_client, some, api_calls, changes, field):
    before = snapshot()
    data = {**VALID, **changes}
    data.pop("id")
    errors = form_errors(admin_client.post(change_url("nightly"), data))
    assert field in errors
    assert snapshot() == before and api_calls == []


def test_editing_a_schedule_deleted_meanwhile_says_so(admin_client, some, monkeypatch):
    data = {**VALID}
    data.pop("id")
    real = schedules.ScheduleHandle.update

    def deleted_first(self: schedules.ScheduleHandle, **kwargs: Any) -> None:
        schedules.ScheduleHandle(self.id).delete()
        real(self, **kwargs)

    monkeypatch.setattr(schedules.ScheduleHandle, "update", deleted_first)
    response = admin_client.post(change_url("nightly"), data, follow=True)
    assert response.redirect_chain == [(CHANGELIST, 302)]
    assert messages_of(response) == ['No schedule "nightly" exists (never created, or deleted). Check the id.']
    assert not LogEntry.objects.exists()


# ------------------------------------------------------------------------------------------ actions


def act(client: Client, action: str, ids: list[str], **extra: Any) -> list[str]:
    response = client.post(CHANGELIST, {"action": action, "_selected_action": ids, "index": "0", **extra}, follow=True)
    assert response.status_code == 200
    return messages_of(response)


def test_pause_and_resume_actions(admin_client, some):
    assert act(admin_client, "pause_schedules", ["nightly", "tick"]) == ['Paused 2 schedules: "nightly", "tick".']
    row = Schedule.objects.get(pk="nightly")
    assert row.paused and row.next_fire_at is None and row.note == "paused in the Django admin by admin"
    resumed = act(admin_client, "resume_schedules", ["nightly", "held", "tick"])
    assert resumed == ['Resumed 3 schedules: "held", "nightly", "tick".']
    assert not Schedule.objects.filter(paused=True).exists()
    assert Schedule.objects.get(pk="held").next_fire_at is not None
    assert LogEntry.objects.filter(object_id="nightly").count() == 2


def test_trigger_action_starts_a_run_or_says_why_not(admin_client, some):
    messages = act(admin_client, "trigger_schedules", ["held", "nightly"])
    runs = dict(Workflow.objects.values_list("schedule_id", "pk"))
    assert set(runs) == {"held", "nightly"}  # a paused schedule can be triggered too
    assert messages == [f'Triggered 2 schedules: "held", "nightly"; started "{runs["held"]}", "{runs["nightly"]}".']
    assert runs["held"].startswith("held@manual-")
    messages = act(admin_client, "trigger_schedules", ["held"])  # overlap="skip" and a run is active
    assert messages == [
        '1 schedule started no run: "held". Its overlap policy skipped it because a run of it is still active.'
    ]
    assert Workflow.objects.filter(schedule_id="held").count() == 1
    assert Schedule.objects.get(pk="held").last_fired_at is not None


def test_delete_action_confirms_then_deletes_through_the_handle(admin_client, some, monkeypatch):
    deleted: list[str] = []
    real = schedules.ScheduleHandle.delete

    def spy(self: schedules.ScheduleHandle) -> None:
        deleted.append(self.id)
        real(self)

    monkeypatch.setattr(schedules.ScheduleHandle, "delete", spy)
    page = admin_client.post(CHANGELIST, {"action": "delete_selected", "_selected_action": ["tick", "held"]})
    assert page.status_code == 200 and "Are you sure" in page.content.decode()
    assert Schedule.objects.count() == 3 and deleted == []
    response = admin_client.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": ["tick", "held"], "post": "yes"}, follow=True
    )
    assert messages_of(response) == ["Successfully deleted 2 schedules."]
    assert deleted == ["held", "tick"]
    assert list(Schedule.objects.values_list("pk", flat=True)) == ["nightly"]


def test_delete_page_confirms_then_deletes(admin_client, some):
    url = f"{ADMIN}/schedule/nightly/delete/"
    assert admin_client.get(url).status_code == 200 and Schedule.objects.filter(pk="nightly").exists()
    response = admin_client.post(url, {"post": "yes"}, follow=True)
    assert response.redirect_chain == [(CHANGELIST, 302)]
    assert not Schedule.objects.filter(pk="nightly").exists()


def test_object_buttons_pause_resume_trigger(admin_client, some):
    assert admin_client.get(act_url("tick", "pause")).status_code == 405  # changes need a POST
    response = admin_client.post(act_url("tick", "pause"), follow=True)
    assert response.redirect_chain == [(change_url("tick"), 302)]
    assert messages_of(response) == ['Paused 1 schedule: "tick".'] and Schedule.objects.get(pk="tick").paused
    assert messages_of(admin_client.post(act_url("tick", "resume"), follow=True)) == ['Resumed 1 schedule: "tick".']
    messages = messages_of(admin_client.post(act_url("tick", "trigger"), follow=True))
    run = Workflow.objects.get(schedule_id="tick")
    assert messages == [f'Triggered 1 schedule: "tick"; started "{run.pk}".']
    assert admin_client.post(act_url("tick", "explode")).status_code == 404
    ghost = messages_of(admin_client.post(act_url("ghost", "pause"), follow=True))
    assert ghost == [
        'Schedule "ghost" was not paused (ScheduleNotFoundError): No schedule "ghost" exists (never created, or '
        "deleted). Check the id."
    ]


# ------------------------------------------------------------------------------- permissions, CSRF


def staff(django_user_model, name: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="weft_django", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_viewer_sees_but_cannot_change(some, django_user_model):
    client = staff(django_user_model, "viewer", "view_schedule", "view_workflow")
    before = snapshot()
    page = client.get(CHANGELIST)
    assert page.status_code == 200 and "pause_schedules" not in page.content.decode()
    detail = client.get(change_url("nightly"))
    assert detail.status_code == 200 and detail.context["object_actions"] == []
    html = detail.content.decode()
    assert "tests.scheduled_run" in html and "5 m" in html and "'label'" not in html  # read-only values
    assert client.get(ADD).status_code == 403
    assert client.post(ADD, {**VALID, "id": "new"}).status_code == 403
    data = {**VALID, "cron": "0 4 * * *"}
    data.pop("id")
    assert client.post(change_url("nightly"), data).status_code == 403
    for action in ("pause", "resume", "trigger"):
        assert client.post(act_url("nightly", action)).status_code == 403
    assert client.post(f"{ADMIN}/schedule/nightly/delete/", {"post": "yes"}).status_code == 403
    assert act(client, "pause_schedules", ["nightly"]) == []  # not offered, so not run
    assert act(client, "delete_selected", ["nightly"], post="yes") == []
    assert snapshot() == before and not Workflow.objects.exists()


def test_each_action_checks_its_own_permission(some, django_user_model):
    operator = staff(django_user_model, "operator", "view_schedule", "change_schedule")
    html = operator.get(CHANGELIST).content.decode()
    assert "pause_schedules" in html and "trigger_schedules" in html and "delete_selected" not in html
    assert operator.get(ADD).status_code == 403
    assert act(operator, "delete_selected", ["tick"], post="yes") == ["No action selected."]
    assert operator.post(f"{ADMIN}/schedule/tick/delete/", {"post": "yes"}).status_code == 403
    assert Schedule.objects.filter(pk="tick").exists()
    assert act(operator, "pause_schedules", ["tick"]) == ['Paused 1 schedule: "tick".']

    creator = staff(django_user_model, "creator", "view_schedule", "add_schedule")
    assert creator.post(act_url("tick", "resume")).status_code == 403
    assert creator.post(ADD, {**VALID, "id": "by-creator"}).status_code == 302
    assert Schedule.objects.filter(pk="by-creator").exists()
    data = {**VALID, "cron": "0 4 * * *"}
    data.pop("id")
    assert creator.post(change_url("by-creator"), data).status_code == 403
    assert Schedule.objects.get(pk="by-creator").cron == "30 2 * * *"

    remover = staff(django_user_model, "remover", "view_schedule", "delete_schedule")
    assert act(remover, "delete_selected", ["tick"], post="yes") == ["Successfully deleted 1 schedule."]
    assert remover.post(act_url("nightly", "trigger")).status_code == 403
    assert not Workflow.objects.exists()


def test_forms_and_actions_enforce_csrf(admin_user, some):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    before = snapshot()
    assert client.post(ADD, {**VALID, "id": "csrf"}).status_code == 403
    data = {**VALID, "cron": "0 4 * * *"}
    data.pop("id")
    assert client.post(change_url("nightly"), data).status_code == 403
    assert client.post(act_url("nightly", "pause")).status_code == 403
    assert client.post(CHANGELIST, {"action": "trigger_schedules", "_selected_action": ["tick"]}).status_code == 403
    assert client.post(f"{ADMIN}/schedule/tick/delete/", {"post": "yes"}).status_code == 403
    assert snapshot() == before and not Workflow.objects.exists()
    client.get(ADD)  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(ADD, {**VALID, "id": "csrf", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and Schedule.objects.filter(pk="csrf").exists()


# ------------------------------------------------------------------- the other engine-owned rows


@pytest.mark.parametrize("model", ["timer", "pendingupdate", "bufferedsignal"])
def test_timers_updates_and_signals_are_read_only_lists(admin_client, some, model):
    assert admin_client.get(f"{ADMIN}/{model}/").status_code == 200
    assert admin_client.get(f"{ADMIN}/{model}/add/").status_code == 403
