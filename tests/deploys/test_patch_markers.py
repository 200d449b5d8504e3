"""ctx.patched markers across deploys: a deploy is the workflow function registered under the same
name swapped between two in-process engines (each run_until_idle is a fresh engine that loads the run
from its rows and replays it). The engine's verdict and the replay check's verdict on the same
history must agree."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from tests.testapp.workflows import add, record_call
from weft_django.engine.replayer import replay
from weft_django.models import Step, Workflow
from weft_django.registry import WorkflowDefinition, registry
from weft_django.store import replay as stored
from weft_django.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)
ROLLED = "tests.deploys.rolled_back"
TWO = "tests.deploys.two_patches"


@weft.workflow(name=ROLLED)
def rolled_v2(ctx: Any) -> Any:  # the deploy that introduced the patch
    if ctx.patched("fee-v2"):
        fee = yield ctx.run(record_call, "fee-v2")
    else:
        fee = yield ctx.run(add, 1, 1)
    payload = yield ctx.wait_for_signal("go")
    return [fee, payload]


def rolled_v1(ctx: Any) -> Any:  # the code the deploy is rolled back to: no patch call
    fee = yield ctx.run(add, 1, 1)
    payload = yield ctx.wait_for_signal("go")
    return [fee, payload]


@weft.workflow(name=TWO)
def two_v1(ctx: Any) -> Any:  # two changes taken at one point: markers "first" and "second"
    ctx.patched("first")
    if ctx.patched("second"):
        step = yield ctx.run(record_call, "second-new")
    else:
        step = yield ctx.run(add, 1, 1)
    payload = yield ctx.wait_for_signal("go")
    return [step, payload]


def two_v2(ctx: Any) -> Any:  # "first" deprecated
    ctx.deprecate_patch("first")
    if ctx.patched("second"):
        step = yield ctx.run(record_call, "second-new")
    else:
        step = yield ctx.run(add, 1, 1)
    payload = yield ctx.wait_for_signal("go")
    return [step, payload]


def two_v3(ctx: Any) -> Any:  # then its deprecate_patch call removed (docs/deploys.md, step 3)
    if ctx.patched("second"):
        step = yield ctx.run(record_call, "second-new")
    else:
        step = yield ctx.run(add, 1, 1)
    payload = yield ctx.wait_for_signal("go")
    return [step, payload]


def _stored(workflow_id: str) -> Any:
    with stored.read_only("default"):
        return next(h for h in stored.page("default", after=None, size=100) if h.workflow_id == workflow_id)


def _deploy(monkeypatch: pytest.MonkeyPatch, name: str, fn: Any) -> None:
    monkeypatch.setitem(registry.workflows, (name, "1"), WorkflowDefinition(fn, name, "1"))


def test_a_rolled_back_patch_whose_branches_differ_gets_the_run_stuck(monkeypatch):
    """A run that took the new branch (marker, then the new activity) replayed by the code rolled
    back to before the patch: the marker is skipped as an unasked one, and the old branch's activity
    meets the new one's step: NonDeterminismError on the run, and the replay check says so too."""
    handle = weft.start(ROLLED, id="rolled-1")
    run_until_idle()
    assert list(Step.objects.filter(workflow_id=handle.id).order_by("seq").values_list("kind", "name")) == [
        ("patch", "fee-v2"),
        ("activity", "tests.testapp.workflows.record_call"),
    ]
    _deploy(monkeypatch, ROLLED, rolled_v1)
    outcome = replay(_stored(handle.id))
    assert not outcome.ok and outcome.error_type == "NonDeterminismError", outcome
    handle.signal("go", "p")
    run_until_idle()
    row = Workflow.objects.get(pk=handle.id)
    assert (row.status, row.result) == ("running", None)
    assert row.stuck_error is not None and row.stuck_error["type"] == "NonDeterminismError", row.stuck_error
    assert "step 1" in row.stuck_error["message"]
    assert not Step.objects.filter(workflow_id=handle.id, name="tests.testapp.workflows.add").exists()


@pytest.mark.parametrize("removed", [two_v2, two_v3], ids=["deprecated", "deprecate-call-removed"])
def test_a_patch_after_a_removed_one_at_the_same_point_keeps_its_answer(monkeypatch, removed):
    """Two changes taken at one point record two markers. Removing the first change's
    ``deprecate_patch`` call (the documented last step of its life) must not change the second's
    answer: its marker lies one past the removed one's. It answered False (the removed marker sat
    at its position), so the run replayed the old branch against the new branch's step and got stuck."""
    handle = weft.start(TWO, id="two-1")
    run_until_idle()
    assert list(Step.objects.filter(workflow_id=handle.id).order_by("seq").values_list("kind", "name")) == [
        ("patch", "first"),
        ("patch", "second"),
        ("activity", "tests.testapp.workflows.record_call"),
    ]
    _deploy(monkeypatch, TWO, removed)
    outcome = replay(_stored(handle.id))
    assert outcome.ok, outcome
    handle.signal("go", "p")
    run_until_idle()
    row = Workflow.objects.get(pk=handle.id)
    assert row.stuck_error is None, row.stuck_error
    assert handle.result(timeout=10) == ["second-new", "p"]
    assert replay(_stored(handle.id)).ok


RANDOM = "tests.deploys.random_after_patch"


@weft.workflow(name=RANDOM)
def random_v1(ctx: Any) -> Any:
    ctx.patched("early")
    token = str(ctx.uuid4())  # drawn after the call, before the next yield
    yield ctx.run(record_call, token)
    yield ctx.wait_for_signal("go")
    return token


def random_v3(ctx: Any) -> Any:  # the change's deprecate_patch call removed at the end of its life
    token = str(ctx.uuid4())
    yield ctx.run(record_call, token)
    yield ctx.wait_for_signal("go")
    return token


@pytest.mark.xfail(
    strict=True,
    reason="ctx.random() is seeded by the step position, which a consumed marker moves: removing the "
    "call moves the values drawn after it before the next yield (docs/deploys.md). Not fixed: any fix "
    "changes the values of runs in flight.",
)
def test_removing_a_patch_call_keeps_the_values_drawn_after_it(monkeypatch):
    from tests.testapp.models import ActivityCall

    handle = weft.start(RANDOM, id="random-1")
    run_until_idle()
    live = ActivityCall.objects.get(name="record_call").key
    _deploy(monkeypatch, RANDOM, random_v3)
    handle.signal("go", "p")
    run_until_idle()
    assert handle.result(timeout=10) == live
