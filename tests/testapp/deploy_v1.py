"""Version 1 of a workflow changed in a deploy (tests/engine/test_deploys.py): an engine started with
WEFT["AUTODISCOVER_MODULE"] = "deploy_v1" runs this code; deploy_v2 is the same workflow after a
change guarded by ctx.patched."""

from __future__ import annotations

from typing import Any

import weft_django as weft

from .models import ActivityCall


@weft.activity(name="tests.deploy.old_step")
def old_step(key: str) -> str:
    ActivityCall.objects.create(name="deploy.old_step", key=key)
    return f"old:{key}"


@weft.workflow(name="tests.deploy")
def deploy(ctx: Any, key: str) -> Any:
    # Deterministic helpers before the first operation: replay must compute the same values.
    seen = [str(ctx.uuid4()), ctx.random().randint(0, 10**9), ctx.now().isoformat()]
    done = yield ctx.run(old_step, f"{key}|{seen[0]}|{seen[1]}|{seen[2]}")
    payload = yield ctx.wait_for_signal("go")
    return {"done": done, "seen": seen, "payload": payload, "after_signal": ctx.now().isoformat()}
