"""The sweep for evicted workflows' mail (engine/residency.py) must not forget mail it failed to act on.

The sweep reads the mail marks of the held workflows, notes the marks of those it recalls (so it does
not recall them again for mail their context has read), then renews their claims and loads them. When
that renewal failed (a database error: on SQLite a write lock held past the busy timeout), the chore
failed, but the marks were already noted: every later sweep took the workflow's mail as read and never
recalled it. A signal whose wake-up was lost (or never sent: SQLite has none) was then never delivered
to the evicted workflow waiting for it. The failure is injected in the recall's renewal statement."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import override_settings

import weft_django as weft
from tests.engine.test_carried_signals import carried_once
from tests.engine.ticking import tick_until
from weft_django.codec import encode_payload
from weft_django.engine.engine import Engine
from weft_django.models import BufferedSignal, Workflow, WorkflowClaim
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)
ONE_RESIDENT = {"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1}


def _sweep(engine: Engine) -> bool:
    """Run the engine's evicted-mail chore once, as its pass does (a failure is logged and contained)."""
    [task] = [task for task in engine.periodic if task.name == "evicted-mail"]
    return task.run_contained(engine, db_now())


@override_settings(WEFT=ONE_RESIDENT)
def test_mail_an_evicted_workflow_was_not_recalled_for_is_found_by_the_next_sweep() -> None:
    engine = Engine("esf", concurrency=2)
    engine.start()
    try:
        for n in range(3):
            weft.start(carried_once, id=f"esf-{n}")
        tick_until(engine, lambda: len(engine.residency.evicted) == 2 and not engine._reload, "two evicted")
        wid = sorted(engine.residency.evicted)[0]
        # A signal whose wake-up never arrived (written without one).
        BufferedSignal.objects.create(
            workflow_id=wid,
            run_id=Workflow.objects.get(pk=wid).run_id,
            name="go",
            payload=encode_payload("found"),
            created_at=db_now(),
        )
        claims = WorkflowClaim._meta.db_table
        failed: list[str] = []

        def renewal_fails(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if claims in sql and "UNION ALL" not in sql and not failed:  # the recall's renewal, not the marks
                failed.append(sql)
                raise OperationalError("database is locked")
            return execute(sql, params, many, context)

        with connection.execute_wrapper(renewal_fails):
            assert _sweep(engine) is False  # the chore failed (logged)
        assert failed and wid in engine.residency.evicted
        _sweep(engine)  # the next sweep
        assert wid not in engine.residency.evicted, "the next sweep took the mail as read and left it evicted"
        tick_until(engine, lambda: weft.get_handle(wid).describe()["status"] == "completed", "its end")
        assert weft.get_handle(wid).result(timeout=1) == "found"
    finally:
        engine.shutdown()
