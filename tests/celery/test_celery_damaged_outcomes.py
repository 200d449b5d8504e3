"""A Celery worker's outcome row damaged by hand (or written by another program): the engine reads it
in its poll (engine/remote.py) and must fail only that attempt or that workflow, saying why.

- ``error_types`` not a list of names (a number): ``tuple(5)`` raised in the poll, at the top of the
  engine's pass, with no workflow to blame: every poll failed the pass and reloaded every workflow,
  and the damaged one was never marked;
- ``error`` not a JSON object: the attempt's failure handling raised; the workflow was made stuck as
  "a bug in weft_django", again after each back-off;
- the step's ``completed_at`` past year 9999 (PostgreSQL): psycopg's DataError failed the whole pass
  (a database error: every owned workflow reloaded).

The engine runs in this process with the Celery executor and the test Celery app (Redis, this run's
key prefix); no worker runs: the test writes the outcome row the worker would write, damaged.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("celery")
redis = pytest.importorskip("redis")

from django.db import connection  # noqa: E402

import weft_django as weft  # noqa: E402
from tests import celery_settings  # noqa: E402
from weft_django.models import RemoteAttempt, Workflow  # noqa: E402
from weft_django.testing import running_engine, wait_for  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def _broker() -> Any:
    return redis.Redis.from_url(celery_settings.CELERY_BROKER_URL, socket_connect_timeout=1)


try:
    _broker().ping()
except redis.RedisError:
    pytest.skip(f"Redis does not answer at {celery_settings.CELERY_BROKER_URL}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _celery_app() -> Any:
    """The test Celery app as the current app (the engine sends through it); this run's broker keys
    (the attempts sent, never consumed) are deleted afterwards."""
    import tests.celery_app  # noqa: F401

    yield
    keys = list(_broker().scan_iter(match=f"{celery_settings.BROKER_KEY_PREFIX}*", count=1000))
    if keys:
        _broker().delete(*keys)


DAMAGED = {
    "error_types a number": (
        "UPDATE weft_django_remoteattempt SET state = 'failed', "
        """error = '{"type": "ConnectionError", "message": "worker lost"}', error_types = '5'"""
    ),
    "error a string": "UPDATE weft_django_remoteattempt SET state = 'failed', error = '\"oops\"', error_types = '[]'",
    "error a list": "UPDATE weft_django_remoteattempt SET state = 'failed', error = '[1, 2]', error_types = '[]'",
}


def _sent(workflow_id: str) -> None:
    wait_for(lambda: RemoteAttempt.objects.filter(workflow_id=workflow_id).exists(), 15, message="the attempt sent")


def _end_of(workflow_id: str) -> Any:
    return Workflow.objects.filter(pk=workflow_id).values_list("status", "error", "stuck_error").get()


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_failure_row_fails_that_attempt_saying_so(caplog, damage):
    caplog.set_level(logging.ERROR, logger="weft_django")
    with running_engine("celery-damaged"):
        weft.start("tests.celery_echo", args=["k"], id="damaged")  # celery_echo: one attempt, no retry
        _sent("damaged")
        with connection.cursor() as cursor:
            cursor.execute(DAMAGED[damage] + " WHERE workflow_id = 'damaged'")
        good = weft.start("tests.sum", args=[2, 3], id="good")
        assert good.result(timeout=20) == {"total": 5}
        wait_for(lambda: _end_of("damaged")[0] != "running", 20, message="the damaged run's end")
    status, error, stuck = _end_of("damaged")
    # The attempt failed; the workflow (which does not catch it) failed with an ActivityError that says why.
    assert (status, error["type"], stuck) == ("failed", "ActivityError", None), (status, error, stuck)
    if damage != "error_types a number":
        assert "the error the worker recorded for this attempt cannot be read" in error["message"], error
    assert "engine pass failed" not in caplog.text, caplog.text  # before: every poll (a number), or stuck as a bug


@pytest.mark.postgres
def test_a_worker_result_whose_completed_at_python_cannot_hold_stops_no_pass(caplog):
    caplog.set_level(logging.ERROR, logger="weft_django")
    with running_engine("celery-damaged"):
        weft.start("tests.celery_echo", args=["k"], id="damaged")
        _sent("damaged")
        with connection.cursor() as cursor:  # the result as a worker commits it, then its time edited
            cursor.execute(
                "UPDATE weft_django_step SET status = 'completed', result = '\"from the worker\"', "
                "completed_at = 'infinity' WHERE workflow_id = 'damaged'"
            )
            cursor.execute("DELETE FROM weft_django_remoteattempt WHERE workflow_id = 'damaged'")
        good = weft.start("tests.sum", args=[2, 3], id="good")
        assert good.result(timeout=20) == {"total": 5}
        assert weft.get_handle("damaged").result(timeout=20) == "from the worker"
    assert "database error in tick" not in caplog.text, caplog.text  # before: psycopg's DataError in the poll
