"""python manage.py weft_demo: a durable workflow surviving a crash, on the project's database.

1. starts an engine (``weft_engine --engine-id demo-engine-1``) in a subprocess,
2. starts ``shop.order_with_approval``: it reserves stock, charges the card, then waits for a signal,
3. kills the engine with SIGKILL (a crash) while the run waits,
4. sends the "approve" signal with no engine running (it is stored in the database),
5. starts a second engine, ``demo-engine-2``, which takes the run over once the dead engine's claim
   expires and resumes it where it was: the signal, a durable 2 s timer, the receipt,
6. prints the result and shows that the card was charged once.

The engines use a short claim TTL (2 s) so the takeover takes seconds; production keeps the defaults
(docs/operations.md).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

# Fast failover for the demo only: a dead engine's claims can be taken over ~3 s after it died.
DEMO_WEFT = {"WORKFLOW_CLAIM_TTL": "2s", "WORKFLOW_CLAIM_RENEW_INTERVAL": "500ms", "POLL_INTERVAL": "100ms"}


class Command(BaseCommand):
    help = (
        "Run the example order workflow through a crash: start an engine, kill it with SIGKILL while the "
        "run waits for a signal, send the signal, start a second engine that resumes the run (signal, "
        "durable timer, receipt), print the result."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--order-id", type=int, default=42)
        parser.add_argument("--amount", default="12.00")
        parser.add_argument("--timeout", type=float, default=60.0, help="Seconds to wait for each stage.")

    def say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise CommandError(f"weft_demo: timed out after {timeout:g}s waiting for {what}.")
            time.sleep(0.1)

    def handle(self, *args: Any, **options: Any) -> None:
        from example_project.shop.workflows import order_with_approval
        from weft_django.models import Step
        from weft_django.testing import EngineProcess

        timeout = options["timeout"]
        first = EngineProcess("demo-engine-1", ["-v", "2"], weft=DEMO_WEFT)
        second: EngineProcess | None = None
        try:
            self.say("1. Started an engine: python manage.py weft_engine --engine-id demo-engine-1")
            handle = order_with_approval.start(options["order_id"], options["amount"])
            self.say(f"2. Started workflow {handle.id} (shop.order_with_approval)")

            def charged() -> bool:
                return Step.objects.filter(workflow_id=handle.id, name="shop.charge_card", status="completed").exists()

            self.wait("the card to be charged", charged, timeout)
            self.say("   demo-engine-1 reserved the stock and charged the card; the run now waits for a signal")

            first.kill()
            first.wait(timeout)
            self.say(f"3. Crash: demo-engine-1 killed with SIGKILL (pid {first.pid}) while the run waits")

            handle.signal("approve", {"by": "alice"})
            self.say('4. handle.signal("approve", {"by": "alice"}) with no engine running: stored in the database')

            second = EngineProcess("demo-engine-2", ["-v", "2"], weft=DEMO_WEFT)
            self.say("5. Started a second engine, demo-engine-2: it takes the run over once the dead claim expires")
            engine = second
            line = self.wait(
                "demo-engine-2 to take the run over",
                lambda: re.search(rf"took over workflow={re.escape(handle.id)}[^\n]*", engine.output()),
                timeout,
            )
            self.say(f"   demo-engine-2 logged: {line.group(0)}")
            self.wait(
                "the run to reach its timer",
                lambda: handle.describe()["pending_timers"] > 0 or handle.status == "completed",
                timeout,
            )
            self.say("6. The signal was delivered; the run sleeps on its durable timer (2 s, kept in the database)")
            result = handle.result(timeout=timeout)
            status = handle.status
        finally:
            for engine_process in (first, second):
                if engine_process is not None:
                    engine_process.stop()

        charge = Step.objects.get(workflow_id=handle.id, name="shop.charge_card")
        times = "once" if charge.attempts == 1 else f"{charge.attempts} times"
        self.say(f"7. Done. charge_card ran {times}: the run resumed from its last completed step after the crash")
        self.say(f"Status: {status}")
        self.say("Result: " + json.dumps(result, indent=2, sort_keys=True))
        self.say("See it in the admin (python manage.py createsuperuser; runserver; /admin/weft_django/workflow/)")
        self.say(f"or from the shell: python manage.py weft describe {handle.id}")
