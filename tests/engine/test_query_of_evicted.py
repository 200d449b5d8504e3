"""A query addressed to an evicted workflow is answered in the pass after its reload, not at the next
poll (session 17's review finding: the pass that recalled it skipped the request as "about to be
loaded" and nothing looked again until POLL_INTERVAL passed, 1 s by default, here 60 s)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.codec import encode
from weft_django.engine.engine import Engine
from weft_django.models import QueryRequest
from weft_django.status import QueryStatus
from weft_django.store.clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.qe_parked")
def qe_parked(ctx: Any) -> Any:
    ctx.on_query("where", lambda: "parked")
    return (yield ctx.wait_for_signal("go"))


@override_settings(WEFT={"POLL_INTERVAL": "60s", "MAX_RESIDENT_WORKFLOWS": 1})
def test_a_query_of_an_evicted_workflow_is_answered_after_its_reload() -> None:
    engine = Engine("qe", concurrency=2)
    engine.start()
    try:
        for n in range(3):
            weft.start(qe_parked, id=f"qe-{n}")
        tick_until(engine, lambda: len(engine.residency.evicted) == 2 and not engine._reload, "two evicted")
        wid = sorted(engine.residency.evicted)[0]
        request = QueryRequest.objects.create(
            workflow_id=wid, engine_id=engine.engine_id, name="where", created_at=db_now(), deadline=db_now()
        )
        engine._queries_waiting = True  # its "q:" wake-up
        engine.tick()  # recalls and reloads the workflow; the request waits for the loaded context
        assert wid in engine.owned
        for _ in range(3):  # no poll is due for a minute: only the engine's own note brings it back
            engine.tick()
        request.refresh_from_db()
        assert request.status != QueryStatus.PENDING, "the query waits for the next poll"
        assert (request.status, request.result) == (QueryStatus.ANSWERED, encode("parked"))
    finally:
        engine.shutdown()
