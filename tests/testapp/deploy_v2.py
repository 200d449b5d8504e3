"""Version 2 of tests/testapp/deploy_v1.py: the first step changed, guarded by ctx.patched, so runs
recorded by version 1 keep the old step and new runs take the new one."""

from __future__ import annotations

from typing import Any

import weft_django as weft

from .models import ActivityCall


@weft.activity(name="tests.deploy.old_step")
def old_step(key: str) -> str:
    ActivityCall.objects.create(name="deploy.old_step", key=key)
    return f"old:{key}"


@weft.activity(name="tests.deploy.new_step")
def new_step(key: str) -> str:
    ActivityCall.objects.create(name="deploy.new_step", key=key)
    return f"new:{key}"


@weft.workflow(name="tests.deploy")
def deploy(ctx: Any, key: str) -> Any:
    seen = [str(ctx.uuid4()), ctx.random().randint(0, 10**9), ctx.now().isoformat()]
    argument = f"{key}|{seen[0]}|{seen[1]}|{seen[2]}"
    if ctx.patched("new-first-step"):
        done = yield ctx.run(new_step, argument)
    else:
        done = yield ctx.run(old_step, argument)
    payload = yield ctx.wait_for_signal("go")
    return {"done": done, "seen": seen, "payload": payload, "after_signal": ctx.now().isoformat()}
