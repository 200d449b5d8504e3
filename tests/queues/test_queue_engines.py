"""Queues across real engine subprocesses on PostgreSQL: a global concurrency limit holds while engines
are frozen (SIGSTOP) and killed (SIGKILL), a rate limit holds in every one-second window, one run per
concurrency key at a time; and one engine on SQLite.

How many run at once is computed from what the activities recorded themselves (ActivityCall rows
"q-start" / "q-end", key "<workflow id>|<pid>"): a run counts from its activity's start to its end.
An attempt whose engine was killed has no end: it ends at the kill. An attempt of a frozen engine goes
on after its thaw, when the run may already have been taken over and finished elsewhere: its
interval is cut at the run's end (``finished_at``): from then the run's slot is free by definition,
and the late attempt is the at-least-once duplicate any engine's zombie can produce (its result is
fenced out). Two attempts of one run (the frozen one and its takeover's) count as one run.
The database's own record is checked too: at no admission did more than ``concurrency`` runs sit
between their ``admitted_at`` and their ``finished_at``.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings
from django.utils import timezone

import weft_django as weft
from tests.testapp.models import ActivityCall
from weft_django.models import Workflow, WorkflowClaim
from weft_django.testing import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

QUEUES = {"cap": {"concurrency": 2}, "rated": {"rate": "5/s"}, "keyed": {"concurrency": 10}}
FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s", "POLL_INTERVAL": "100ms"}
WEFT = {"QUEUES": QUEUES, **FAST}


def _intervals(kills: dict[int, dt.datetime]) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """(workflow id, start, end) of every attempt the activities recorded."""
    finished = dict(Workflow.objects.values_list("id", "finished_at"))
    opened: dict[str, list[dt.datetime]] = {}
    found = []
    for name, key, at in (
        ActivityCall.objects.filter(name__in=["q-start", "q-end"])
        .order_by("created_at", "id")
        .values_list("name", "key", "created_at")
    ):
        if name == "q-start":
            opened.setdefault(key, []).append(at)
        elif opened.get(key):
            found.append((key, opened[key].pop(0), at))
    for key, starts in opened.items():  # no end: its engine was killed (or it is still running)
        pid = int(key.split("|")[1])
        for start in starts:
            found.append((key, start, kills.get(pid, timezone.now())))
    cut = []
    for key, start, end in found:
        wid = key.split("|")[0]
        done = finished.get(wid)
        cut.append((wid, start, min(end, done) if done is not None else end))
    return cut


def _most_at_once(intervals: list[tuple[str, dt.datetime, dt.datetime]]) -> int:
    most = 0
    for _, start, _ in intervals:  # the count only rises at a start
        running = {wid for wid, s, e in intervals if s <= start < e}
        most = max(most, len(running))
    return most


def _most_admitted_at_once(queue: str) -> int:
    rows = list(Workflow.objects.filter(queue=queue).values_list("admitted_at", "finished_at"))
    far = timezone.now() + dt.timedelta(days=1)
    return max(sum(1 for a, f in rows if a is not None and a <= t < (f or far)) for t, _ in rows if t is not None)


@override_settings(WEFT=WEFT)
def test_concurrency_two_across_three_engines_frozen_and_killed(weft_engines):
    engines = [weft_engines(f"q-{name}", "-v", "2", weft=WEFT) for name in "abc"]
    ids = [weft.start("tests.queued", kwargs={"seconds": 0.5}, queue="cap", id=f"cap-{i:02d}").id for i in range(16)]
    kills: dict[int, dt.datetime] = {}

    def holder(among: list) -> object:
        return next((engine for engine in among if engine.claims()), None)

    # Freeze an engine while it runs a queued run: its slot stays taken until its claim is taken over.
    frozen = wait_for(lambda: holder(engines), timeout=30, message="an engine holds a queued run")
    frozen.freeze()
    held = set(frozen.claims())
    wait_for(
        lambda: not WorkflowClaim.objects.filter(workflow_id__in=held, engine_id=frozen.engine_id).exists(),
        timeout=30,
        message="the frozen engine's runs taken over",
    )
    frozen.thaw()
    # Kill another while it runs one.
    others = [engine for engine in engines if engine is not frozen]
    killed = wait_for(lambda: holder(others), timeout=30, message="another engine holds a queued run")
    killed.kill()
    kills[killed.pid] = timezone.now()
    killed.wait()
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=50,
        message="every queued run completed",
    )
    intervals = _intervals(kills)
    assert _most_at_once(intervals) == 2, sorted(intervals, key=lambda row: row[1])
    assert _most_admitted_at_once("cap") == 2
    takeovers = [e.output() for e in engines if "took over workflow=cap-" in e.output()]
    assert takeovers, "no run was taken over: the freeze and the kill tested nothing"


@override_settings(WEFT=WEFT)
def test_rate_five_per_second_over_thirty_starts(weft_engines):
    for name in "ab":
        weft_engines(f"r-{name}", weft=WEFT)
    ids = [weft.start("tests.queued", queue="rated", id=f"rated-{i:02d}").id for i in range(30)]
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == 30,
        timeout=50,
        message="every rated run completed",
    )
    admitted = sorted(Workflow.objects.filter(id__in=ids).values_list("admitted_at", flat=True))
    second = dt.timedelta(seconds=1)
    windows = [sum(1 for a in admitted if t <= a < t + second) for t in admitted]
    assert max(windows) == 5, admitted
    assert admitted[-1] - admitted[0] >= dt.timedelta(seconds=5)  # 30 at 5/s: six windows at least


@override_settings(WEFT=WEFT)
def test_one_run_per_concurrency_key_across_engines(weft_engines):
    for name in "ab":
        weft_engines(f"k-{name}", weft=WEFT)
    ids = [
        weft.start(
            "tests.queued", kwargs={"seconds": 0.3}, queue="keyed", concurrency_key=f"cust-{i % 2}", id=f"k{i}"
        ).id
        for i in range(8)
    ]
    wait_for(
        lambda: Workflow.objects.filter(id__in=ids, status="completed").count() == 8,
        timeout=50,
        message="every keyed run completed",
    )
    intervals = _intervals({})
    for key in ("cust-0", "cust-1"):
        mine = [row for row in intervals if int(row[0][1:]) % 2 == int(key[-1])]
        assert _most_at_once(mine) == 1, mine
    assert _most_at_once(intervals) == 2  # the two keys ran side by side
