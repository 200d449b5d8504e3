"""The Celery executor end to end: real ``celery worker`` subprocesses over the machine's Redis and
real engine subprocesses, on the test database. No task_always_eager anywhere.

Workers run tests/celery_app.py with tests/celery_settings.py (a Redis database; this run's keys carry
a prefix and are emptied before each test, so concurrent runs do not interfere). Skipped when Celery
or redis-py is missing or Redis does not answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("celery")
redis = pytest.importorskip("redis")

from django.db import connections  # noqa: E402

import weft_django as weft  # noqa: E402
from tests import celery_settings  # noqa: E402
from tests.testapp import workflows as testflows  # noqa: E402
from tests.testapp.models import ActivityCall, Reservation  # noqa: E402
from weft_django.codec import decode, encode_payload  # noqa: E402
from weft_django.conf import database_alias  # noqa: E402
from weft_django.contrib.celery import RUN_ACTIVITY, RUN_MAINTENANCE  # noqa: E402
from weft_django.models import BufferedSignal, RemoteAttempt, Step, Workflow, WorkflowClaim  # noqa: E402
from weft_django.testing import wait_for  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

BROKER = celery_settings.CELERY_BROKER_URL
QUEUES = "weft-tests,weft-tests-other"
ROOT = Path(__file__).resolve().parents[2]
FAST = {"WORKFLOW_CLAIM_TTL": "3s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "1s"}


def _redis_answers() -> bool:
    try:
        return bool(redis.Redis.from_url(BROKER, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


if not _redis_answers():
    pytest.skip(f"Redis does not answer at {BROKER}", allow_module_level=True)


def engine_env(**weft_overrides: object) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.celery_settings",
        "WEFT_TEST_OVERRIDES": json.dumps({**FAST, **weft_overrides}),
    }


class Worker:
    """``celery -A tests.celery_app worker`` on the test database, in its own process group."""

    def __init__(self, name: str, pool: str, concurrency: int, visibility: float | None = None) -> None:
        alias = database_alias()
        self.name = name
        self.log_path = f"/tmp/weft-celery-{name}-{os.getpid()}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.celery_settings",
            "WEFT_TEST_DATABASE_NAME": str(connections[alias].settings_dict["NAME"]),
            "WEFT_LOG_LEVEL": "INFO",
            "PGAPPNAME": f"weft-worker-{name}"[:63],
            **({"WEFT_TEST_CELERY_VISIBILITY": str(visibility)} if visibility else {}),
        }
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery_app",
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--queues={QUEUES}",
            f"--hostname={name}@%h",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--loglevel=INFO",
        ]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for(lambda: " ready." in self.output() or self.process.poll() is not None, 90, message=f"{name} ready")
        assert self.process.poll() is None, self.output()

    def output(self) -> str:
        return Path(self.log_path).read_text()

    def kill(self) -> None:
        """SIGKILL the whole worker: its main process and its pool."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._log.close()


@pytest.fixture(autouse=True)
def empty_broker() -> Iterator[None]:
    broker = redis.Redis.from_url(BROKER)

    def empty() -> None:  # only this run's keys: another suite may share the Redis database
        keys = list(broker.scan_iter(match=f"{celery_settings.BROKER_KEY_PREFIX}*", count=1000))
        if keys:
            broker.delete(*keys)

    empty()
    yield
    empty()


@pytest.fixture
def celery_worker() -> Iterator[object]:
    started: list[Worker] = []

    def start(name: str, pool: str = "threads", concurrency: int = 2, visibility: float | None = None) -> Worker:
        worker = Worker(name, pool, concurrency, visibility)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
def app():
    from tests.celery_app import app

    return app


def attempt_message(workflow_id: str, activity: object, *args: object) -> dict[str, object]:
    """The kwargs of the run_activity task the engine sent for the attempt running now."""
    step = Step.objects.get(workflow_id=workflow_id, seq=0)
    return {
        "workflow_id": workflow_id,
        "run_id": str(step.run_id),
        "seq": 0,
        "attempt": step.attempts,
        "epoch": WorkflowClaim.objects.get(pk=workflow_id).epoch,
        "activity": activity.name,  # type: ignore[attr-defined]
        "args_text": encode_payload({"args": list(args), "kwargs": {}}),
    }


def calls(name: str) -> list[str]:
    return list(ActivityCall.objects.filter(name=name).order_by("id").values_list("key", flat=True))


def test_results_errors_retries_queues_and_atomic_writes_flow_back(celery_worker, weft_engines):
    celery_worker("tour")
    engine = weft_engines("celery-tour", "-v", "2", env=engine_env())
    result = weft.start("tests.celery_tour", args=["tour", 7], id="celery-tour").result(timeout=90)

    assert result["echoed"]["value"] == {"nested": (1, 2), "text": "é"}
    assert result["echoed"]["attempt"] == 1
    assert result["echoed"]["pid"] != engine.pid  # it ran on the worker
    assert result["flaky"] == 2  # failed on the worker once, retried by the engine
    assert result["errors"]["refused"] == {"type": "ValueError", "attempts": 1, "message": "bad input on a worker"}
    untimed = result["errors"]["untimed"]
    assert (untimed["type"], untimed["attempts"]) == ("ConfigurationError", 1)
    assert "needs a per-attempt timeout" in untimed["message"]
    assert calls("celery_untimed") == []  # never sent
    assert result["other"] == "tour via weft-tests-other"
    assert result["reserved"] == 7
    assert Reservation.objects.filter(order_id=7).count() == 1
    assert calls("celery_flaky") == ["tour", "tour"]
    # Successful attempts leave no RemoteAttempt rows behind; failed ones stay (the retry's key differs).
    assert set(RemoteAttempt.objects.values_list("activity", "state")) == {
        (testflows.celery_refuses.name, "failed"),
    }


def test_activity_executor_celery_sends_every_activity(celery_worker, weft_engines):
    celery_worker("all-celery")
    engine = weft_engines("celery-default", "-v", "2", env=engine_env(ACTIVITY_EXECUTOR="celery"))
    result = weft.start("tests.timed_sum", args=[2, 3]).result(timeout=60)
    assert result["sum"] == 5
    assert result["pid"] != engine.pid
    # Per-attempt timeouts and heartbeats keep their semantics on a worker: both attempts time out.
    timed_out = weft.start("tests.timeouts", args=["remote-timeouts"]).result(timeout=60)
    assert timed_out == {"type": "ActivityTimeoutError", "attempts": 2}


def test_heartbeats_answer_activity_progress_and_a_cancel_stops_the_worker(celery_worker, weft_engines, tmp_path):
    worker = celery_worker("progress")
    weft_engines("celery-progress", "-v", "2", env=engine_env())
    handle = weft.start("tests.celery_progress", args=["p", str(tmp_path / "gate")], id="celery-progress")
    wait_for(lambda: calls("celery_progress"), 90, message="the attempt to start")

    def activity_progress() -> dict:
        try:
            return handle.query("activity_progress") or {}
        except weft.QueryTimeoutError:  # the engine is busy (a loaded machine): ask again
            return {}

    progress = wait_for(activity_progress, 30, message="a heartbeat")
    assert progress["key"] == "p" and progress["step"] >= 1
    wait_for(lambda: activity_progress().get("step", 0) > progress["step"], 30, message="a later heartbeat")
    handle.cancel()
    wait_for(lambda: "remote attempt stopped" in worker.output(), 30, message="the worker to stop the attempt")
    assert Step.objects.get(workflow_id="celery-progress", seq=0).status == "running"  # nothing recorded


def test_a_worker_killed_mid_activity_is_retried_on_a_live_worker(celery_worker, weft_engines):
    doomed = celery_worker("doomed", pool="prefork")
    weft_engines("celery-sigkill", "-v", "2", env=engine_env())
    handle = weft.start("tests.celery_dies_first", args=["k"], id="celery-sigkill")
    wait_for(lambda: calls("celery_dies_first") == ["k@1"], 90, message="attempt 1 to start")
    doomed.kill()
    # The survivor hands out unacknowledged messages of dead workers again after 5s (Redis: an hour).
    survivor = celery_worker("survivor", visibility=5)
    # Attempt 1's message stays unacknowledged meanwhile; the engine's per-attempt timeout (3s)
    # fences attempt 1 out and sends attempt 2, which the live worker runs (or a later one, when the
    # survivor starts too slowly for attempt 2's 3 s: a loaded machine).
    winner = handle.result(timeout=90)["attempt"]
    assert winner >= 2
    step = Step.objects.get(workflow_id="celery-sigkill", seq=0)
    assert (step.status, step.attempts) == ("completed", winner)
    # Then Redis redelivers attempt 1: the survivor skips it without running it.
    skipped = "remote attempt skipped workflow=celery-sigkill seq=0 attempt=1"
    wait_for(lambda: skipped in survivor.output(), 30, message="the redelivery of attempt 1 to be skipped")
    ran = calls("celery_dies_first")
    assert ran[0] == "k@1" and ran[-1] == f"k@{winner}" and len(ran) == len(set(ran)), ran  # attempt 1 not re-run
    assert Step.objects.get(workflow_id="celery-sigkill", seq=0).result == step.result
    assert RemoteAttempt.objects.filter(workflow_id="celery-sigkill").count() == 0  # cleared by the success


def test_a_duplicate_delivery_records_one_result(celery_worker, weft_engines, app, tmp_path):
    worker = celery_worker("dup", concurrency=3)
    weft_engines("celery-dup", "-v", "2", env=engine_env())
    gate = tmp_path / "gate"
    handle = weft.start("tests.celery_gated_then_wait", args=["dup", str(gate)], id="celery-dup")
    wait_for(lambda: len(calls("celery_gated")) == 1, 90, message="the first delivery to start")
    message = attempt_message("celery-dup", testflows.celery_gated, "dup", str(gate))
    app.send_task(RUN_ACTIVITY, kwargs=message)  # the same task again: both deliveries run at once
    wait_for(lambda: len(calls("celery_gated")) == 2, 30, message="the duplicate to start")
    gate.touch()

    refusal = f"remote result refused workflow=celery-dup seq=0 attempt=1 epoch={message['epoch']}"
    wait_for(lambda: refusal in worker.output(), 30, message="the duplicate's refusal")
    assert f"{refusal} disposition=already recorded" in worker.output()
    assert len({line for line in worker.output().splitlines() if refusal in line and "/" in line[:40]}) == 1
    recorded = Step.objects.get(workflow_id="celery-dup", seq=0)
    deliveries = list(ActivityCall.objects.filter(name="celery_gated").values_list("pk", flat=True))
    assert len(deliveries) == 2
    assert decode(recorded.result)["call"] in deliveries

    # A late redelivery (after the result is in) is not even run.
    app.send_task(RUN_ACTIVITY, kwargs=message)
    wait_for(lambda: "remote attempt skipped workflow=celery-dup" in worker.output(), 30, message="the skip")
    assert len(calls("celery_gated")) == 2
    handle.signal("finish")
    assert handle.result(timeout=60) == decode(recorded.result)
    assert Step.objects.get(workflow_id="celery-dup", seq=0).result == recorded.result


def test_the_old_epochs_result_is_refused_after_a_takeover(celery_worker, weft_engines, tmp_path):
    worker = celery_worker("epochs", concurrency=3)
    first = weft_engines("celery-epoch-a", "-v", "2", env=engine_env())
    gate = tmp_path / "gate"
    handle = weft.start("tests.celery_gated", args=["epoch", str(gate)], id="celery-epoch")
    wait_for(lambda: len(calls("celery_gated")) == 1, 90, message="attempt 1 under the first epoch")
    old_epoch = WorkflowClaim.objects.get(pk="celery-epoch").epoch
    first.kill()
    first.wait()
    weft_engines("celery-epoch-b", "-v", "2", env=engine_env())
    # The second engine takes the workflow over (a new epoch) and sends attempt 1 again.
    wait_for(lambda: len(calls("celery_gated")) == 2, 90, message="attempt 1 under the new epoch")
    new_epoch = WorkflowClaim.objects.get(pk="celery-epoch").epoch
    assert new_epoch > old_epoch
    assert calls("celery_gated") == [f"epoch@1/{old_epoch}", f"epoch@1/{new_epoch}"]
    gate.touch()

    result = handle.result(timeout=60)
    assert (result["attempt"], result["epoch"]) == (1, new_epoch)
    step = Step.objects.get(workflow_id="celery-epoch", seq=0)
    assert (step.epoch, step.attempts) == (new_epoch, 1)
    refusal = f"remote result refused workflow=celery-epoch seq=0 attempt=1 epoch={old_epoch} disposition=stale epoch"
    wait_for(lambda: refusal in worker.output(), 30, message="the old epoch's refusal")


def test_maintenance_task_and_workflows_started_and_signalled_from_tasks(celery_worker, app):
    celery_worker("maintenance")
    app.send_task("tests.start_workflow", args=["tests.signals", [], "from-celery"])
    wait_for(lambda: Workflow.objects.filter(pk="from-celery").exists(), 60, message="the start")
    app.send_task("tests.signal_workflow", args=["from-celery", "go", {"by": "celery"}])
    wait_for(lambda: BufferedSignal.objects.filter(workflow_id="from-celery").exists(), 30, message="the signal")
    assert Workflow.objects.get(pk="from-celery").status == "running"
    app.send_task(RUN_MAINTENANCE)  # one engine pass inside the worker (BACKGROUND_TASKS = "manual" hosts)
    assert weft.get_handle("from-celery").result(timeout=60) == {"by": "celery"}
    assert WorkflowClaim.objects.get(pk="from-celery").engine_id is None  # the pass released its claims
