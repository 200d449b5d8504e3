"""weft.fork (reuse the first N recorded steps, run the rest on the current code) and the bulk
operations by filter (cancel, retry, purge, confirmed by a count), with their bad inputs (issue 19)."""

from __future__ import annotations

import time

import pytest
from django.apps import apps
from django.utils import timezone

import weft_django as weft
from tests.testapp import visibility_workflows
from weft_django.exceptions import (
    BulkCountChangedError,
    InvalidFilterError,
    InvalidForkError,
    InvalidWorkflowIdError,
    WorkflowAlreadyExistsError,
    WorkflowNotFoundError,
)
from weft_django.models import Step, Workflow, WorkflowAttribute, WorkflowClaim
from weft_django.testing import run_until_idle, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in apps.get_app_config("weft_django").get_models()}


@pytest.fixture
def fixed():
    """The activity's and the workflow's behaviour before the bug fix (v1), restored after."""
    visibility_workflows.FORK_VERSION["value"] = "v1"
    yield visibility_workflows.FORK_VERSION
    visibility_workflows.FORK_VERSION["value"] = "v1"


def test_fork_reuses_the_first_steps_and_runs_the_rest_on_current_code(fixed):
    source = weft.start("visibility.failing", args=["f1"])
    run_until_idle()
    assert source.status == "failed"
    fixed["value"] = "v2"  # the fix is deployed
    kept = weft.fork(source.id, from_step=1, new_id="forked-1")
    fresh = weft.fork(source.id, from_step=0)
    assert kept.id == "forked-1" and fresh.id != source.id
    run_until_idle()
    assert kept.result(timeout="5s") == "a:v1"  # step 0's recorded result was reused
    assert fresh.result(timeout="5s") == "a:v2"  # everything ran again
    assert source.status == "failed"  # the source is untouched
    assert Step.objects.filter(workflow_id=source.id).count() == 1
    # replay set the attributes again on the new runs
    assert weft.count_workflows(attributes={"batch": "f1"}) == 3


def test_fork_bad_inputs_change_nothing(fixed):
    done = weft.start("visibility.order", args=["a", 1.0], id="fork-src")
    run_until_idle()
    assert done.status == "completed"
    recorded = Step.objects.filter(workflow_id=done.id).count()
    unsettled = weft.start("visibility.order", args=["b", 1.0], id="fork-unsettled")
    source_step = Step.objects.filter(workflow_id=done.id).order_by("seq").first()
    Step.objects.create(
        workflow_id=unsettled.id,
        run_id=Workflow.objects.get(pk=unsettled.id).run_id,
        seq=0,
        kind=source_step.kind,
        name=source_step.name,
        status="running",
        attempts=1,
        epoch=1,
        started_at=timezone.now(),
    )
    before = snapshot()
    cases = [
        (dict(workflow_id="no-such", from_step=0), WorkflowNotFoundError, "No workflow"),
        (dict(workflow_id=done.id, from_step=recorded + 1), InvalidForkError, "beyond"),
        (dict(workflow_id=done.id, from_step=-1), InvalidForkError, ">= 0"),
        (dict(workflow_id=done.id, from_step=True), InvalidForkError, "whole number"),
        (dict(workflow_id=done.id, from_step="1"), InvalidForkError, "whole number"),
        (dict(workflow_id=unsettled.id, from_step=1), InvalidForkError, "has not settled"),
        (dict(workflow_id=done.id, from_step=1, new_id=unsettled.id), WorkflowAlreadyExistsError, "already exists"),
        (dict(workflow_id=done.id, from_step=1, new_id=""), InvalidWorkflowIdError, "new_id"),
    ]
    for arguments, error, words in cases:
        workflow_id = arguments.pop("workflow_id")
        with pytest.raises(error, match=words):
            weft.fork(workflow_id, **arguments)
        assert snapshot() == before, arguments
    assert weft.fork(done.id, from_step=recorded).id  # the whole history is a valid fork point


def test_bulk_cancel_by_attribute_with_confirmation_count():
    batch = [weft.start("visibility.waiter", args=["b1"], attributes={"batch": "b1"}).id for _ in range(5)]
    other = weft.start("visibility.waiter", args=["b2"], attributes={"batch": "b2"}).id
    assert weft.bulk_count("cancel", attributes={"batch": "b1"}) == 5
    before = snapshot()
    statuses = dict(Workflow.objects.values_list("pk", "status"))
    with pytest.raises(BulkCountChangedError) as caught:
        weft.bulk_cancel(attributes={"batch": "b1"}, expected_count=4)
    assert (caught.value.expected, caught.value.actual) == (4, 5)
    assert snapshot() == before and dict(Workflow.objects.values_list("pk", "status")) == statuses
    result = weft.bulk_cancel(attributes={"batch": "b1"}, expected_count=5, reason="bad batch", batch_size=2)
    assert (result.matched, result.changed, result.skipped) == (5, 5, [])
    assert set(Workflow.objects.filter(status="cancelled").values_list("pk", flat=True)) == set(batch)
    assert set(Workflow.objects.filter(pk__in=batch).values_list("cancel_reason", flat=True)) == {"bad batch"}
    assert Workflow.objects.get(pk=other).status == "running"
    assert weft.bulk_count("cancel", attributes={"batch": "b1"}) == 0  # a cancelled run is no longer active


def test_bulk_retry_and_purge(fixed):
    failed = [weft.start("visibility.failing", args=["r1"]).id for _ in range(3)]
    run_until_idle()
    assert weft.count_workflows(status="failed", attributes={"batch": "r1"}) == 3
    assert weft.bulk_count("retry", attributes={"batch": "r1"}, status=["failed", "running"]) == 3
    assert weft.bulk_count("retry", attributes={"batch": "r1"}, status="running") == 0
    fixed["value"] = "v2"
    result = weft.bulk_retry(attributes={"batch": "r1"}, expected_count=3)
    assert result.changed == 3
    run_until_idle()
    assert set(Workflow.objects.filter(pk__in=failed).values_list("status", flat=True)) == {"completed"}
    keep = weft.start("visibility.waiter", args=["r1"], attributes={"batch": "r1"}).id  # active: not purged
    result = weft.bulk_purge(attributes={"batch": "r1"}, expected_count=3, batch_size=2)
    assert (result.changed, result.skipped) == (3, [])
    assert list(Workflow.objects.values_list("pk", flat=True)) == [keep]
    assert set(WorkflowAttribute.objects.values_list("workflow_id", flat=True)) == {keep}  # purged with the runs


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: weft.bulk_cancel(expected_count=-1), "expected_count"),
        (lambda: weft.bulk_cancel(expected_count=True), "expected_count"),
        (lambda: weft.bulk_cancel(expected_count=1, batch_size=0), "batch_size"),
        (lambda: weft.bulk_cancel(expected_count=1, attributes={"nosuch": 1}), "no registered workflow"),
        (lambda: weft.bulk_cancel(expected_count=1, colour="red"), "Unknown filter"),
        (lambda: weft.bulk_count("delete"), "operation must be"),
    ],
)
def test_bulk_bad_inputs_change_nothing(call, words):
    weft.start("visibility.waiter", args=["z"], attributes={"batch": "z"})
    before = snapshot()
    with pytest.raises(InvalidFilterError, match=words):
        call()
    assert snapshot() == before


@pytest.mark.subprocess
def test_bulk_cancel_against_a_running_engine_is_fenced(weft_engines):
    """The engine keeps committing steps of the runs while bulk_cancel goes through them: each cancel
    takes its fenced transaction, draws a new epoch and deposes the engine, whose later commits for
    that run are refused; nothing of the runs' is written after their cancel."""
    ids = [weft.start("visibility.waiter", args=["live"], attributes={"batch": "live"}).id for _ in range(12)]
    engine = weft_engines("visibility-bulk")
    wait_for(
        lambda: (
            Step.objects.filter(workflow_id__in=ids, status="completed").values("workflow_id").distinct().count()
            == len(ids)
        ),
        timeout=60,
        message="every run to commit a step",
    )
    result = weft.bulk_cancel(attributes={"batch": "live"}, expected_count=12, batch_size=5)
    assert (result.changed, result.skipped) == (12, [])
    steps_after_cancel = {wid: Step.objects.filter(workflow_id=wid).count() for wid in ids}
    epochs = dict(WorkflowClaim.objects.filter(pk__in=ids).values_list("pk", "epoch"))
    time.sleep(1.5)  # the engine keeps running (its other passes, any carried writes)
    assert engine.process.poll() is None
    assert set(Workflow.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
    assert {wid: Step.objects.filter(workflow_id=wid).count() for wid in ids} == steps_after_cancel
    late = Step.objects.filter(workflow_id__in=ids, epoch__gte=min(epochs.values()))
    assert not [s for s in late if s.epoch >= epochs[s.workflow_id]]  # no step at the cancel's epoch or later
    assert not WorkflowClaim.objects.filter(pk__in=ids, engine_id__isnull=False).exists()
    # Attributes commit with the steps they follow, in order: "ticks" is n exactly when tick n's
    # completion is durable (and not before), whatever the cancel cut off.
    for page in (weft.list_workflows(attributes={"batch": "live"}, limit=50),):
        for summary in page:
            done = Step.objects.filter(workflow_id=summary.id, name="visibility.step", status="completed").count()
            assert summary.attributes.get("ticks") == done - 1, (summary.id, summary.attributes, done)


def test_weft_fork_is_the_function_once_every_module_is_imported():
    """Regression: the module was weft_django/fork.py, and importing it (the admin and the CLI do) set
    the package attribute ``fork`` to the module, so ``weft.fork(...)`` raised "'module' object is not
    callable" depending on import order."""
    import importlib

    for name in ("weft_django.admin.visibility", "weft_django.management.visibility_cli", "weft_django.bulk"):
        importlib.import_module(name)
    from weft_django.forking import afork, fork

    assert weft.fork is fork and weft.afork is afork
