"""Two updates admitted for one workflow reach the engine in one settlement: the first (taken by
``wait_for_update``) is answered with ``respond()``, which leaves the workflow not durable until that
settlement commits, so the second is skipped in that batch. It must be settled on a later pass: before
the fix (found by a helper's review, session 17) nothing looked at it again until the mailbox sweep,
seconds later, by when its caller's ``update()`` had usually timed out."""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings
from django.utils import timezone

import weft_django as weft
from tests.engine.ticking import tick_until
from weft_django.codec import encode_payload
from weft_django.engine.engine import Engine
from weft_django.models import PendingUpdate, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@weft.workflow(name="tests.update_then_ping")
def update_then_ping(ctx):
    pings = []
    ctx.on_update("ping", lambda value: pings.append(value) or len(pings))
    payload, respond = yield ctx.wait_for_update("start")
    respond({"started": payload})
    yield ctx.sleep("1h")
    return pings


def _admit(wid: str, name: str, payload: object) -> uuid.UUID:
    row = PendingUpdate.objects.create(
        id=uuid.uuid4(),
        workflow_id=wid,
        run_id=Workflow.objects.get(pk=wid).run_id,
        name=name,
        payload=encode_payload(payload),
        created_at=timezone.now(),
    )
    return row.id


@override_settings(WEFT={"POLL_INTERVAL": "60s"})  # no mailbox sweep during the test
def test_an_update_skipped_behind_another_of_the_same_batch_is_settled_on_a_later_pass() -> None:
    handle = weft.start(update_then_ping, id="two-updates")
    engine = Engine("two-updates-engine")
    engine.start()
    try:
        tick_until(engine, lambda: handle.id in engine.owned and engine.owned[handle.id].armed, "the update wait")
        start, ping = _admit(handle.id, "start", "go"), _admit(handle.id, "ping", "p1")
        engine.wake.look_at(handle.id)
        tick_until(engine, lambda: PendingUpdate.objects.get(pk=start).status == "completed", "the first update")
        for _ in range(5):
            engine.tick()
        assert PendingUpdate.objects.get(pk=ping).status == "completed", "the second update was left admitted"
    finally:
        engine.shutdown()
