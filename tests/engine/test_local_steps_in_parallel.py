"""Local activities side by side (``ctx.all``): they run one after the other on the loop thread, and
each step is stamped when it really began and returned (a review of 3173da4)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import weft_django as weft
from tests.engine.test_local_activity_faults import lf_slow, signalled_as_its_wait_is_armed
from weft_django.models import Step

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.lp_two_then_wait")
def lp_two_then_wait(ctx: Any) -> Any:
    yield ctx.all([ctx.run(lf_slow, 1.0), ctx.run(lf_slow, 1.0)])
    try:
        return (yield ctx.wait_for_signal("go", timeout="1s"))
    except weft.WaitTimeoutError:
        return "timed out"


def test_side_by_side_local_steps_end_one_after_the_other_and_the_next_wait_gets_its_timeout() -> None:
    """Two 1 s local steps of one frontier end 2 s after the pass began, not 1 s: the second began when
    the first returned. The wait armed after them gets its whole second (it was due as it was armed)."""

    def stamped_one_after_the_other() -> None:
        first, second = Step.objects.filter(workflow_id="lp-two", kind="activity").order_by("seq")
        assert first.completed_at is not None and second.started_at is not None and second.completed_at is not None
        assert second.started_at >= first.completed_at, (first.completed_at, second.started_at)
        assert second.completed_at - first.completed_at >= timedelta(seconds=0.9)

    signalled_as_its_wait_is_armed(lp_two_then_wait, "lp-two", stamped_one_after_the_other)
