"""A workflow that waits for a signal again and again, with a backlog of them buffered, takes the
backlog in one pass's settle cascade: each consumption and the step it settles go into that pass's one
fenced commit, in the order the workflow made them.

Before, each record took a pass and a durable commit of its own: the next wait was armed in the
cascade, and only the next pass looked at the known mailbox. An entity workflow with a backlog then
drained at the speed of commits (2,000 signals: 16.9 s, 8.4 ms each). The commits are counted here,
not timed: the distinct transactions that wrote the workflow's steps (PostgreSQL's ``xmin``).

PostgreSQL only: there a context knows its mailbox (its load's read, then the rows its ``S:`` wake-ups
carry). SQLite reads the mailbox in each pass that looks at the workflow, one record per pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import weft_django as weft
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, Step, Workflow
from weft_django.status import SignalState

from .ticking import tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

BACKLOG = 60


@weft.workflow(name="tests.signal_backlog_in_order")
def collecting(ctx: Any, n: int) -> Any:
    seen = []
    for _ in range(n):
        seen.append((yield ctx.wait_for_signal("item")))
    return seen


@weft.workflow(name="tests.signal_backlog_with_timeout")
def collecting_with_timeout(ctx: Any, n: int) -> Any:
    seen = []
    for _ in range(n):
        seen.append((yield ctx.wait_for_signal("item", timeout="1h")))
    return seen


def _step_transactions(workflow_id: str) -> int:
    """How many transactions wrote this workflow's steps."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(DISTINCT xmin::text) FROM {Step._meta.db_table} WHERE workflow_id = %s", [workflow_id]
        )
        return int(cursor.fetchone()[0])


def _drain(workflow: Any, workflow_id: str, *, buffered_before_load: bool) -> tuple[list[Any], int]:
    """Start ``workflow`` for BACKLOG signals, buffer them all, let one in-process engine run it; its
    result and how many transactions wrote its steps."""
    handle = weft.start(workflow, args=[BACKLOG], id=workflow_id)
    engine = Engine(f"{workflow_id}-engine", concurrency=2)
    if buffered_before_load:
        for i in range(BACKLOG):
            handle.signal("item", i)
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned, "the workflow held")
        for _ in range(3):  # it waits for its first signal, its mailbox known
            engine.tick()
        if not buffered_before_load:
            for i in range(BACKLOG):
                handle.signal("item", i)
        tick_until(
            engine,
            lambda: Workflow.objects.filter(pk=handle.id, status="completed").exists(),
            f"{handle.id} completed",
            timeout=60,
        )
    finally:
        engine.shutdown()
    consumed = BufferedSignal.objects.filter(workflow_id=handle.id, state=SignalState.CONSUMED).count()
    assert consumed == BACKLOG
    return handle.result(timeout=5), _step_transactions(handle.id)


@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no maintenance pass: the wake-ups and armed waits drive it
@pytest.mark.parametrize("buffered_before_load", [True, False], ids=["buffered-before-load", "sent-while-parked"])
def test_a_backlog_of_signals_is_taken_in_a_few_commits_in_the_order_sent(buffered_before_load: bool) -> None:
    result, transactions = _drain(
        collecting, f"backlog-order-{buffered_before_load}", buffered_before_load=buffered_before_load
    )
    assert result == list(range(BACKLOG))
    # Sent while parked, the S: wake-ups arrive over several passes; each pass takes what has arrived.
    assert transactions <= 10, f"{transactions} commits wrote the steps of {BACKLOG} consumed signals"


@override_settings(WEFT={"POLL_INTERVAL": "60s"})
def test_a_backlog_taken_in_one_pass_disarms_each_wait_timeout() -> None:
    result, transactions = _drain(collecting_with_timeout, "backlog-timeout", buffered_before_load=True)
    assert result == list(range(BACKLOG))
    assert transactions <= 10, f"{transactions} commits wrote the steps of {BACKLOG} consumed signals"
    from weft_django.models import Timer

    assert not Timer.objects.filter(workflow_id="backlog-timeout").exists()
