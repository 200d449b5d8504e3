"""A query handler runs once, on the live context, and is neither recorded nor replayed: weft refuses
the durable calls in it (set_attributes, respond()), but cannot see it assign workflow state. What it
changes is the live generator's only; a replay (here the next engine, after the first released the run
at shutdown) goes on without it, as concepts.md § Queries and updates says. An update handler's change
is replayed (tests/client/test_update_order_after_takeover.py)."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.testing import owns, running_engine

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.query_that_changes_state")
def query_that_changes_state(ctx: weft.WorkflowContext):  # type: ignore[no-untyped-def]
    state = {"approved": False}

    def approve() -> str:  # breaks the rule: a query must change nothing
        state["approved"] = True
        return "approved"

    ctx.on_query("approve", approve)
    ctx.expose(approved=lambda: state["approved"])
    yield ctx.wait_for_signal("go")
    return "shipped" if state["approved"] else "held"


def test_what_a_query_handler_changed_is_gone_after_a_replay() -> None:
    handle = weft.start(query_that_changes_state, id="query-changes")
    with running_engine("first") as first:
        owns(first, handle.id)
        assert handle.query("approve", timeout="20s") == "approved"
        assert handle.query("approved", timeout="20s") is True  # the live generator saw it
    with running_engine("second") as second:  # the first released its claim: this one replays
        owns(second, handle.id)
        assert handle.query("approved", timeout="20s") is False
        handle.signal("go")
        outcome: Any = handle.result(timeout=20)
    assert outcome == "held"  # not what the live run would have returned ("shipped")
