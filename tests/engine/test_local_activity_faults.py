"""Local activities (``local=True``) under conditions the first tests did not reach (a helper's review)."""

from __future__ import annotations

from typing import Any

import pytest

import weft_django as weft
from weft_django.engine.engine import Engine

pytestmark = pytest.mark.django_db(transaction=True)


@weft.activity(name="tests.lf_add_one", local=True)
def lf_add_one(n: int) -> int:
    return n + 1


@weft.workflow(name="tests.lf_many_local")
def lf_many_local(ctx: Any, count: int) -> Any:
    total = 0
    for _ in range(count):
        total = yield ctx.run(lf_add_one, total)
    return total


def test_a_workflow_with_more_local_steps_than_one_pass_settles_completes() -> None:
    """Each local step is one round of the pass's settle cascade. A workflow whose local steps
    outnumber the cascade's rounds (1,000) must go on in a later pass, not be left at an unarmed
    frontier with nothing that would ever arm it."""
    handle = weft.start(lf_many_local, args=[1200], id="lf-many")
    engine = Engine("lf-many", concurrency=2)
    engine.run_until_idle(timeout=60)
    assert handle.describe()["status"] == "completed"
    assert handle.result(timeout=5) == 1200
