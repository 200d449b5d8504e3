"""Text the database cannot store stays with its workflow (a helper's review, session 19).

PostgreSQL refuses a NUL in text and in jsonb. An activity's exception message with a NUL went into
its step's error (jsonb) as it was: the engine's fenced commit raised a DataError, the engine reloaded
every workflow of the batch, ran the activity again and failed the same way, pass after pass (the
activity ran 1,840 times in 12 s, its run never failed, the batch's other workflows were rolled back
each time). A validator's message or an update handler's exception did the same through the update's
error. Now the messages weft records are made storable (``codec.storable_text``), and a commit the
database refuses for a value is split: the others' writes land and the one whose own writes are
refused is made stuck with the reason (``engine/containment.contain_refused_commit``).
"""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.engine import driver, steps
from weft_django.models import Workflow
from weft_django.testing import owns, run_until_idle, running_engine, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
postgres = pytest.mark.postgres  # SQLite stores a NUL: the NUL cases are PostgreSQL's

RUNS: list[str] = []


@weft.activity(name="tests.unstorable.raises_nul")
def raises_nul(tag: str) -> None:
    RUNS.append(tag)
    raise ValueError(f"bad \x00 byte in {tag}")


@weft.workflow(name="tests.unstorable.activity")
def activity_with_nul_error(ctx, tag: str):
    yield ctx.run(raises_nul, tag)
    return "unreachable"


@weft.workflow(name="tests.unstorable.updates")
def updates_with_nul(ctx):
    notes: list[str] = []

    def note(value: str) -> int:
        notes.append(value)
        return len(notes)

    def broken(value: str) -> None:
        raise RuntimeError(f"broke on {value}")

    ctx.on_update("note", note, validator=lambda value: None if value == "ok" else f"refused {value}")
    ctx.on_update("broken", broken)
    yield ctx.wait_for_signal("stop")
    return notes


@postgres
def test_an_activity_error_with_a_nul_fails_its_run_once_and_the_others_complete():
    RUNS.clear()
    bad = weft.start(activity_with_nul_error, args=["once"], id="nul-activity")
    good = weft.start("tests.sum", args=[2, 3], id="nul-neighbour")
    run_until_idle(timeout=20)
    assert RUNS == ["once"]  # one attempt (no retry policy), not one per pass
    row = Workflow.objects.get(pk=bad.id)
    assert row.status == "failed"
    assert "bad \\x00 byte in once" in row.error["message"]
    with pytest.raises(weft.WorkflowFailedError):
        bad.result(timeout=1)
    assert good.result(timeout=1) == {"total": 5}


@postgres
def test_an_update_refused_or_failed_with_a_nul_in_its_message_is_answered():
    handle = weft.start(updates_with_nul, id="nul-updates")
    with running_engine("nul-updates") as engine:
        owns(engine, handle.id)
        with pytest.raises(weft.UpdateValidationError) as refused:
            handle.update("note", "a\x00b", timeout="10s")
        assert "refused a\\x00b" in str(refused.value)
        with pytest.raises(weft.UpdateFailedError) as failed:
            handle.update("broken", "c\x00d", timeout="10s")
        assert "broke on c\\x00d" in str(failed.value)
        assert handle.update("note", "ok", timeout="10s") == 1  # the workflow and the engine go on
        handle.signal("stop")
        assert handle.result(timeout=10) == ["ok"]


@postgres
def test_a_value_the_database_refuses_makes_its_workflow_stuck_and_the_batch_commits(monkeypatch):
    """The net behind the cleaning: with it switched off, the NUL reaches the database."""
    monkeypatch.setattr(driver, "storable_text", lambda text: text)
    RUNS.clear()
    bad = weft.start(activity_with_nul_error, args=["net"], id="nul-net")
    good = [weft.start("tests.sum", args=[n, 1], id=f"nul-net-{n}") for n in range(3)]
    run_until_idle(timeout=20)
    assert [h.result(timeout=1) for h in good] == [{"total": 1}, {"total": 2}, {"total": 3}]
    row = Workflow.objects.get(pk=bad.id)
    assert row.status == "running" and row.stuck_error is not None
    assert row.stuck_error["type"] == "EngineInternalError"
    assert "DataError" in row.stuck_error["message"]
    assert RUNS == ["net"]  # stuck with back-off: not run again pass after pass


@weft.workflow(name="tests.unstorable.signal_name")
def waits_for_a_bad_name(ctx, kind: str):
    return (yield ctx.wait_for_signal("a\x00b" if kind == "nul" else "a\ud800b"))  # (no codec takes a surrogate)


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
def test_a_signal_name_the_database_cannot_store_fails_its_run_with_a_definition_error(kind):
    """Names given in workflow code become step names: checked like the registry's (session 19's review)."""
    bad = weft.start(waits_for_a_bad_name, args=[kind], id="bad-signal-name")
    good = weft.start("tests.sum", args=[1, 1], id="bad-signal-name-neighbour")
    run_until_idle(timeout=20)
    row = Workflow.objects.get(pk=bad.id)
    assert row.status == "failed" and row.error["type"] == "WorkflowDefinitionError"
    assert "without NUL or unpaired surrogates" in row.error["message"]
    assert good.result(timeout=1) == {"total": 2}


@weft.activity(name="tests.unstorable.raises_surrogate")
def raises_surrogate() -> None:
    raise ValueError("bad \ud800 half")


@weft.workflow(name="tests.unstorable.surrogate")
def activity_with_surrogate_error(ctx):
    yield ctx.run(raises_surrogate)


@postgres
def test_a_surrogate_the_database_refuses_is_contained_too(monkeypatch):
    """An unpaired surrogate in a jsonb value: PostgreSQL's JSON parser refuses it (SQLite stores it);
    in a text value the driver would refuse it (UnicodeEncodeError), contained the same way."""
    monkeypatch.setattr(driver, "storable_text", lambda text: text)
    bad = weft.start(activity_with_surrogate_error, id="surrogate-net")
    good = weft.start("tests.sum", args=[2, 2], id="surrogate-net-neighbour")
    run_until_idle(timeout=20)
    assert good.result(timeout=1) == {"total": 4}
    row = Workflow.objects.get(pk=bad.id)
    assert row.status == "running" and row.stuck_error["type"] == "EngineInternalError"
    assert "DataError" in row.stuck_error["message"] or "UnicodeEncodeError" in row.stuck_error["message"]


@weft.workflow(name="tests.unstorable.driver_stuck")
def made_stuck_by_the_driver(ctx):
    yield ctx.sleep(1)


@postgres
def test_a_refused_stuck_mark_of_a_pass_still_leaves_its_workflow_stuck(monkeypatch):
    """A pass that makes a run stuck with no new step, its mark refused: it was taken for the
    containment's own refused mark and left held but never driven (session 19's review)."""
    monkeypatch.setattr(steps, "storable_text", lambda text: text)
    real = driver.WorkflowRun._advance

    def fails_with_a_nul(self, *args, **kwargs):
        if self.ctx.workflow_id == "stuck-mark-refused":
            raise RuntimeError("bad \x00 here")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(driver.WorkflowRun, "_advance", fails_with_a_nul)
    handle = weft.start(made_stuck_by_the_driver, id="stuck-mark-refused")
    with running_engine("stuck-mark-refused") as engine:
        wait_for(lambda: Workflow.objects.get(pk=handle.id).stuck_error is not None, timeout=10)
        row = Workflow.objects.get(pk=handle.id)
        assert row.stuck_error["type"] == "EngineInternalError" and "DataError" in row.stuck_error["message"]
        assert handle.id not in engine.owned
