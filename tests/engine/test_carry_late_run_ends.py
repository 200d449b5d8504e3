"""The mailbox sweep carries a signal that committed for a run after it continued as new to the
workflow's current run (store/continuation._move_late) through mailbox.write_unlocked: its rows are
locked first (SKIP LOCKED), then written. The write dropped the query's condition that the current
run is still active (checked only by the lock's SELECT): a run that ended between the two statements
made the UPDATE set ``run_id`` to NULL (the current run's id read through a subquery of active runs),
an IntegrityError that failed the sweep. PostgreSQL: the two statements only exist there."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

import weft_django as weft
from tests.deploys.test_continue_as_new import _chain, _on_old_run
from tests.testapp import deploy_chain  # noqa: F401 - registers tests.deploys.counter
from weft_django.conf import database_alias
from weft_django.models import BufferedSignal, Workflow
from weft_django.store import continuation
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _end_elsewhere(workflow_id: str) -> None:
    """Another transaction (its own connection) ends the workflow's current run and commits."""

    def end() -> None:
        try:
            Workflow.objects.filter(pk=workflow_id).update(status="completed")
        finally:
            connections.close_all()

    thread = threading.Thread(target=end)
    thread.start()
    thread.join(10)


def test_a_late_signal_is_not_carried_to_a_run_that_ends_as_it_is_carried():
    if connection.vendor != "postgresql":
        pytest.skip("the lock and the write are one statement elsewhere")
    handle = weft.start("tests.deploys.counter", args=[1, 0], id="carry-ends")
    handle.signal("add", 1)
    run_until_idle(timeout=20)
    ((old, _new),) = _chain(handle.id)
    late = _on_old_run(BufferedSignal, handle.id, old, name="add", payload="5")
    table = BufferedSignal._meta.db_table

    def ends_before_the_write(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith(f'UPDATE "{table}"'):  # the carry's write, after its lock
            _end_elsewhere(handle.id)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(ends_before_the_write):
        moved = continuation.carry_late(database_alias())
    late.refresh_from_db()
    assert (moved, str(late.run_id), late.state) == (0, old, "buffered")
