"""weft.fork and the deterministic helpers: below the fork point the kept steps replay as the source's
did, so ``ctx.random()``, ``ctx.uuid4()`` and ``ctx.now()`` there give the source's values; from the
fork point on, the fork's own (docs/visibility.md, docs/deploys.md). A fork of a fork keeps the first
source's values below both points, a fork of a continued run its latest run's, and the replay check
(``weft export`` + ``testing.replay``, ``weft replay``) replays a fork with the values it ran with."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.core.management import call_command
from django.db import connections

import weft_django as weft
from tests.testapp import visibility_workflows
from weft_django.exceptions import InvalidArgumentError, InvalidForkError
from weft_django.models import Step, Workflow
from weft_django.testing import replay, run_until_idle, running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HELPERS = "tests.fork_determinism.helpers"
LOOPING = "tests.fork_determinism.looping"


@weft.workflow(name=HELPERS)
def helpers(ctx):
    """Values drawn at positions 0, 1 and 2 (after the two kept steps of a fork at 2)."""
    at0 = [ctx.now().isoformat(), str(ctx.uuid4()), ctx.random().random()]
    a = yield ctx.run(visibility_workflows.step, "a")
    at1 = [ctx.now().isoformat(), str(ctx.uuid4()), ctx.random().random()]
    b = yield ctx.run(visibility_workflows.step, "b")
    at2 = [str(ctx.uuid4()), ctx.random().random()]
    return {"at0": at0, "at1": at1, "at2": at2, "steps": [a, b]}


@weft.workflow(name=LOOPING)
def looping(ctx, rounds: int):
    """Continues as new once: the second run's values are its own."""
    token = str(ctx.uuid4())
    a = yield ctx.run(visibility_workflows.step, f"r{rounds}")
    if rounds:
        return (yield ctx.continue_as_new(rounds - 1))
    return [token, a, str(ctx.uuid4())]


def _completed(workflow_id: str) -> dict:
    handle = weft.get_handle(workflow_id)
    return handle.result(timeout=10)


def _export(workflow_id: str) -> dict:
    out = io.StringIO()
    call_command("weft", "export", workflow_id, stdout=out)
    return json.loads(out.getvalue())


def test_a_fork_sees_the_sources_deterministic_values_below_its_fork_point():
    weft.start(HELPERS, id="fd-src")
    run_until_idle()
    source = _completed("fd-src")
    weft.fork("fd-src", from_step=2, new_id="fd-2")
    weft.fork("fd-src", from_step=1, new_id="fd-1")
    run_until_idle()
    at2, at1 = _completed("fd-2"), _completed("fd-1")
    # from_step=2: positions 0 and 1 are the source's; position 2 (the fork point) is the fork's own
    assert (at2["at0"], at2["at1"], at2["steps"]) == (source["at0"], source["at1"], source["steps"])
    assert at2["at2"] != source["at2"]
    # from_step=1: position 0 is the source's; from position 1 the fork's own values (its own start)
    assert at1["at0"] == source["at0"]
    assert at1["at1"][1:] != source["at1"][1:]
    assert at1["at1"][0] >= Workflow.objects.get(pk="fd-1").started_at.isoformat()
    # a fork of the fork below both points: still the first source's values
    weft.fork("fd-1", from_step=1, new_id="fd-1-1")
    weft.fork("fd-2", from_step=2, new_id="fd-2-2")
    weft.fork("fd-1", from_step=2, new_id="fd-1-2")
    run_until_idle()
    assert _completed("fd-1-1")["at0"] == source["at0"]
    assert (_completed("fd-2-2")["at0"], _completed("fd-2-2")["at1"]) == (source["at0"], source["at1"])
    # fd-1-2 keeps fd-1's two steps: position 0 the source's, position 1 fd-1's own
    assert (_completed("fd-1-2")["at0"], _completed("fd-1-2")["at1"]) == (source["at0"], at1["at1"])


def test_the_replay_check_replays_a_fork_with_the_values_it_ran_with():
    weft.start(HELPERS, id="fr-src")
    run_until_idle()
    weft.fork("fr-src", from_step=2, new_id="fr-fork")
    run_until_idle()
    assert _completed("fr-fork")
    exported = _export("fr-fork")
    assert replay(exported, HELPERS).ok  # a completed run whose code returns another result fails
    out = io.StringIO()
    call_command("weft", "replay", stdout=out)
    assert "0 would fail" in out.getvalue()
    # a history file whose fork origin was edited by hand is refused, naming it
    broken = dict(exported, fork_origin={"run": exported["run_id"], "below": "x"})
    with pytest.raises(InvalidArgumentError, match="fork.origin"):
        replay(broken, HELPERS)


def test_a_fork_of_a_continued_run_sees_that_runs_values():
    weft.start(LOOPING, args=[1], id="fc-src")
    run_until_idle()
    source = _completed("fc-src")
    weft.fork("fc-src", from_step=1, new_id="fc-fork")  # the latest run: its own input and step
    run_until_idle()
    forked = _completed("fc-fork")
    assert forked[:2] == source[:2] and forked[2] != source[2]


def test_a_fork_whose_source_origin_is_damaged_is_refused_with_nothing_written():
    weft.start(HELPERS, id="fb-src")
    run_until_idle()
    weft.fork("fb-src", from_step=1, new_id="fb-fork")
    run_until_idle()
    row = Workflow.objects.get(pk="fb-fork")
    Workflow.objects.filter(pk="fb-fork").update(fork_origin={"run": str(row.run_id), "below": [[1, 5, None]]})
    with pytest.raises(InvalidForkError, match="fork origin"):
        weft.fork("fb-fork", from_step=1, new_id="fb-again")
    assert not Workflow.objects.filter(pk="fb-again").exists()


def _steps(workflow_id: str, below: int | None = None) -> dict[int, tuple]:
    rows = Step.objects.filter(workflow_id=workflow_id)
    if below is not None:
        rows = rows.filter(seq__lt=below)
    return {s.seq: (s.kind, s.name, s.status, s.result, s.completed_at) for s in rows}


def test_forks_of_a_running_source_and_of_one_being_cancelled_copy_the_steps_it_had():
    """Proven fine: forks taken while an engine commits the source's steps, and one taken while a
    cancel of the source commits, each keep exactly the source's settled steps below their point
    (or are refused, nothing written, when the point is beyond them)."""
    weft.start("visibility.waiter", args=["fl"], id="fl-src", attributes={"batch": "fl"})
    forks: list[tuple[str, int]] = []
    with running_engine("fl-engine"):
        wait_for(lambda: Step.objects.filter(workflow_id="fl-src", status="completed").count() >= 4, timeout=30)
        for round_ in range(10):
            recorded = Step.objects.filter(workflow_id="fl-src").count()
            for point in (recorded - 1, recorded, recorded + 1):
                try:
                    forks.append((weft.fork("fl-src", from_step=point, new_id=f"fl-{round_}-{point}").id, point))
                except InvalidForkError:
                    assert not Workflow.objects.filter(pk=f"fl-{round_}-{point}").exists()
        errors: list[BaseException] = []

        def cancel() -> None:
            try:
                weft.cancel("fl-src")
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=cancel)
        thread.start()
        forks.append((weft.fork("fl-src", from_step=2, new_id="fl-during-cancel").id, 2))
        thread.join(30)
        assert not errors
    assert Workflow.objects.get(pk="fl-src").status == "cancelled"
    assert len(forks) >= 11
    source = _steps("fl-src")
    for fork_id, point in forks:
        assert _steps(fork_id, point) == {seq: step for seq, step in source.items() if seq < point}, fork_id
