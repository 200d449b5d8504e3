"""A concurrency key the database cannot store (a NUL in it: PostgreSQL text refuses it) must not hold
back the activity's other attempts. Before the fix its slot request failed with a DataError on every
try, the limiter took that for a refusal of the whole activity, and every later attempt of that
activity on the engine waited behind it for ever."""

from __future__ import annotations

import pytest

import weft_django as weft
from weft_django.models import ActivitySlot
from weft_django.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]  # SQLite stores a NUL


def test_a_key_with_a_nul_does_not_hold_back_the_activitys_other_attempts():
    bad = weft.start("tests.charges", args=[["ann\x00x", "ann\x00y"], 0.0], id="nul-key")
    good = weft.start("tests.charges", args=[["bob"], 0.0], id="plain-key")
    run_until_idle(timeout=10, concurrency=4)
    assert good.result(timeout=1) == ["bob"]
    with pytest.raises(weft.WorkflowFailedError, match="NUL"):  # its attempt ran: charge's own row refuses a NUL
        bad.result(timeout=1)
    keys = set(ActivitySlot.objects.values_list("key", flat=True))
    assert keys == {"bob", "ann\\x00x", "ann\\x00y"}  # the NUL keys stored escaped, still apart


@weft.activity(concurrency_key="tenant\x00a")  # a fixed key: 1-255 characters, accepted at decoration
def fixed_key_step(value: int) -> int:
    return value + 1


@weft.workflow(name="tests.queues.fixed_nul_key")
def fixed_nul_key(ctx, value: int):
    return (yield ctx.run(fixed_key_step, value))


def test_a_fixed_key_with_a_nul_does_not_hold_back_the_activity():
    # The fixed-string concurrency_key went to the slot request as it was (only a callable's key was
    # escaped): the same DataError on every try, and every attempt of the activity waited for ever.
    handle = weft.start("tests.queues.fixed_nul_key", args=[1], id="fixed-nul-key")
    run_until_idle(timeout=10)
    assert handle.result(timeout=1) == 2
    assert set(ActivitySlot.objects.values_list("key", flat=True)) == {"tenant\\x00a"}
