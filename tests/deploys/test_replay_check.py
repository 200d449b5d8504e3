"""The replay check (``manage.py weft replay``), ``weft export`` and ``weft_django.testing.replay``,
and ctx.patched / ctx.deprecate_patch / the deterministic helpers on replay, on the test database
with the in-process engine. The check writes nothing: row counts of every table are unchanged and
the database itself refuses writes inside its transaction."""

from __future__ import annotations

import io
import json

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError

import weft_django as weft
from tests.testapp.workflows import add
from weft_django.conf import database_alias
from weft_django.exceptions import InvalidArgumentError, NonDeterminismError, WorkflowDefinitionError
from weft_django.models import Step, Workflow
from weft_django.registry import WorkflowDefinition, registry
from weft_django.store.replay import read_only
from weft_django.testing import replay, run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)
GATE = "tests.deploys.gate"


@weft.workflow(name=GATE)
def gate(ctx, n: int):
    token = str(ctx.uuid4())
    x = yield ctx.run(add, n, 1)
    payload = yield ctx.wait_for_signal("go")
    return [x, payload, token, ctx.random().randint(0, 10**6)]


def gate_changed(ctx, n: int):  # the first step changed with no patch: old runs cannot replay
    token = str(ctx.uuid4())
    yield ctx.sleep("1s")
    x = yield ctx.run(add, n, 1)
    payload = yield ctx.wait_for_signal("go")
    return [x, payload, token, ctx.random().randint(0, 10**6)]


def gate_patched(ctx, n: int):  # the same change behind ctx.patched: old runs take the old branch
    token = str(ctx.uuid4())
    if ctx.patched("sleep-first"):
        yield ctx.sleep("1s")
    x = yield ctx.run(add, n, 1)
    payload = yield ctx.wait_for_signal("go")
    return [x, payload, token, ctx.random().randint(0, 10**6)]


def gate_deprecated(ctx, n: int):  # the cleanup: only the new branch, old histories with the marker replay
    token = str(ctx.uuid4())
    ctx.deprecate_patch("sleep-first")
    yield ctx.sleep("1s")
    x = yield ctx.run(add, n, 1)
    payload = yield ctx.wait_for_signal("go")
    return [x, payload, token, ctx.random().randint(0, 10**6)]


@weft.workflow(name="tests.deploys.bad_patch")
def bad_patch(ctx, change_id):
    ctx.patched("a\ud800b" if change_id == "surrogate" else change_id)  # (no codec takes a surrogate)
    yield ctx.run(add, 1, 1)


def _counts() -> dict[str, int]:
    models = [*apps.get_app_config("weft_django").get_models(), *apps.get_app_config("testapp").get_models()]
    return {model.__name__: model.objects.count() for model in models}


def _export(workflow_id: str) -> dict:
    out = io.StringIO()
    call_command("weft", "export", workflow_id, stdout=out)
    return json.loads(out.getvalue())


def _replay_cli(*args: str) -> tuple[str, CommandError | None]:
    out = io.StringIO()
    try:
        call_command("weft", "replay", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


@pytest.fixture
def runs() -> dict[str, str]:
    """Two runs of the gate: one completed, one parked on its signal."""
    done = weft.start(GATE, args=[1], id="gate-done")
    parked = weft.start(GATE, args=[2], id="gate-parked")
    run_until_idle()
    done.signal("go", "payload")
    run_until_idle()
    assert done.result(timeout=10)[:2] == [2, "payload"]
    return {"done": done.id, "parked": parked.id}


def test_the_check_passes_on_unchanged_code_and_writes_nothing(runs):
    before = _counts()
    output, error = _replay_cli()
    assert error is None, output
    assert "Replayed 2 run(s)" in output and "0 would fail" in output
    assert _counts() == before


def test_the_check_reports_each_run_a_change_breaks_and_exits_1(runs, monkeypatch):
    monkeypatch.setitem(registry.workflows, (GATE, "1"), WorkflowDefinition(gate_changed, GATE, "1"))
    before = _counts()
    output, error = _replay_cli("--type", GATE)
    assert error is not None and "2 of 2" in str(error)
    assert f"FAIL {runs['done']}" in output and f"FAIL {runs['parked']}" in output
    assert "NonDeterminismError" in output
    assert _counts() == before
    # --open: only the run an engine still replays; --limit caps the runs.
    output, error = _replay_cli("--open", "--json")
    report = json.loads(output)
    assert report["replayed"] == 1 and [f["workflow_id"] for f in report["failed"]] == [runs["parked"]]
    output, error = _replay_cli("--limit", "1")
    assert "Replayed 1 run(s)" in output
    # The same change behind ctx.patched passes: both recorded runs take the old branch.
    monkeypatch.setitem(registry.workflows, (GATE, "1"), WorkflowDefinition(gate_patched, GATE, "1"))
    output, error = _replay_cli()
    assert error is None, output


def test_the_check_reports_an_unregistered_version(runs):
    Workflow.objects.filter(id=runs["parked"]).update(version="0")
    output, error = _replay_cli()
    assert error is not None and "VersionMismatchError" in output


def test_the_database_refuses_writes_inside_the_checks_transaction(runs):
    before = _counts()
    using = database_alias()
    with pytest.raises(DatabaseError), read_only(using):
        Workflow.objects.using(using).filter(id=runs["parked"]).update(current_step="written")
    assert _counts() == before
    assert Workflow.objects.get(id=runs["parked"]).current_step != "written"
    Workflow.objects.filter(id=runs["parked"]).update(current_step="after")  # writes work again after it


def test_export_and_testing_replay(runs, tmp_path):
    history = _export(runs["parked"])
    assert history["format"] == "weft-history/1"
    assert [step["kind"] for step in history["steps"]] == ["activity"]
    path = tmp_path / "parked.json"
    out = io.StringIO()
    call_command("weft", "export", runs["parked"], "--output", str(path), stdout=out)
    assert json.loads(path.read_text()) == history
    assert replay(str(path), gate).frontier == 1
    assert replay(history, GATE).ok
    with pytest.raises(NonDeterminismError):
        replay(path, gate_changed)
    # The patched code replays the old history (old branch) and a new one (marker, new branch); its
    # cleanup replays both.
    assert replay(history, gate_patched).frontier == 1
    completed = _export(runs["done"])
    assert replay(completed, gate).ok
    with pytest.raises(NonDeterminismError):
        replay(completed, gate_deprecated)  # the old history has no sleep: the cleanup is too early for it
    new = dict(
        history, steps=[{"seq": 0, "kind": "patch", "name": "sleep-first", "status": "completed", "result": "true"}]
    )
    assert replay(new, gate_patched).frontier == 1  # marker at 0, the sleep at 1
    assert replay(new, gate_deprecated).frontier == 1
    # A marker the code no longer asks for is skipped: code without the patch at all replays it too.
    assert replay(new, gate_changed).frontier == 1


def test_bad_histories_and_ids(runs, tmp_path):
    with pytest.raises(CommandError, match="No workflow 'missing'"):
        call_command("weft", "export", "missing", stdout=io.StringIO())
    with pytest.raises(InvalidArgumentError):
        replay(tmp_path / "absent.json", gate)
    with pytest.raises(InvalidArgumentError):
        replay({"format": "something else"}, gate)
    with pytest.raises(InvalidArgumentError):
        replay({"format": "weft-history/1"}, gate)


@pytest.mark.parametrize("change_id", ["", "   ", 42, None, "x" * 256, "a\x00b", "surrogate"])
def test_a_bad_change_id_fails_the_run_and_records_no_marker(change_id):
    handle = weft.start("tests.deploys.bad_patch", args=[change_id])
    run_until_idle()
    with pytest.raises(weft.WorkflowFailedError) as failed:
        handle.result(timeout=10)
    assert failed.value.error["type"] == "WorkflowDefinitionError"
    assert "change id" in failed.value.error["message"]
    assert not Step.objects.filter(workflow_id=handle.id).exists()


def test_helpers_outside_the_workflow_code_are_refused():
    from weft_django.context import WorkflowContext

    ctx = WorkflowContext(workflow_id="w", run_id="r", workflow_type="t", started_at=None, epoch=1)
    for call in (lambda: ctx.patched("x"), lambda: ctx.deprecate_patch("x"), ctx.random, ctx.uuid4, ctx.now):
        with pytest.raises(WorkflowDefinitionError):
            call()
    with pytest.raises(WorkflowDefinitionError, match="change id"):
        ctx.patched("")


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_the_replay_checks_read_takes_no_write_lock_on_sqlite() -> None:
    """The replay check replays each page inside its read-only transaction; on SQLite Django's
    transaction is IMMEDIATE, so it held the database's one write lock and every engine's commit
    waited (or failed "database is locked") while workflow code was replayed."""
    from weft_django.conf import database_alias
    from weft_django.store import replay as stored
    from weft_django.store.backend import backend

    weft.start("tests.sum", args=[1, 2], id="replayed")
    using = database_alias()
    with stored.read_only(using):
        assert [history.workflow_id for history in stored.page(using, after=None, size=10)] == ["replayed"]
        assert backend(using).write_lock_free()
        with pytest.raises(DatabaseError):  # and still nothing can be written through it
            weft.start("tests.sum", args=[1, 2], id="written")


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_an_atomic_block_inside_the_read_only_transaction_reads_on_sqlite() -> None:
    """Replayed code or Django may open an atomic block: it is a savepoint, as on PostgreSQL (the
    hand-written BEGIN DEFERRED of 1922655 left Django in autocommit, and the block's BEGIN IMMEDIATE
    was refused as a write)."""
    from django.db import connection, transaction

    from weft_django.conf import database_alias
    from weft_django.models import Workflow
    from weft_django.store import replay as stored

    weft.start("tests.sum", args=[1, 2], id="read-inside")
    with stored.read_only(database_alias()), transaction.atomic():
        assert Workflow.objects.count() == 1
    with connection.cursor() as cursor:  # and the connection writes again afterwards
        cursor.execute("PRAGMA query_only")
        assert cursor.fetchone()[0] == 0
    weft.start("tests.sum", args=[1, 2], id="written-after")


@pytest.mark.postgres
def test_the_replay_checks_reads_share_one_snapshot_on_postgresql() -> None:
    """A page's runs, steps and timers are separate statements: under READ COMMITTED a commit between
    them mixed two moments of one run. The read-only transaction weft begins is REPEATABLE READ; inside a
    caller's transaction (whose isolation is set already) it stays as it is."""
    from django.db import connections, transaction

    from weft_django.store import replay as stored

    using = database_alias()
    with stored.read_only(using), connections[using].cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        assert cursor.fetchone()[0] == "repeatable read"
    with transaction.atomic(using=using):
        Workflow.objects.using(using).exists()  # a query first: the isolation level is fixed now
        with stored.read_only(using), connections[using].cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone()[0] == "read committed"
