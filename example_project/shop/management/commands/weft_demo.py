"""python manage.py weft_demo: start one order pipeline, run an engine in-process until it is done."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Start the example order pipeline, run an in-process engine until it completes, print the result."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--order-id", type=int, default=42)
        parser.add_argument("--amount", default="12.00")
        parser.add_argument("--timeout", type=float, default=30.0, help="Seconds to wait for completion.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from weft_django import testing
            from weft_django.status import is_terminal

            run_until_idle = testing.run_until_idle
        except (ImportError, AttributeError) as exc:
            raise CommandError(
                f"weft_demo: the engine is not available yet ({exc}). The example workflow is defined "
                f"(example_project/shop/workflows.py) but weft_django.testing.run_until_idle() is missing."
            ) from exc

        from example_project.shop.workflows import order_pipeline

        handle = order_pipeline.start(options["order_id"], options["amount"])
        self.stdout.write(f"Started workflow {handle.id} (shop.order_pipeline)")
        # run_until_idle() returns while the workflow waits for its 1 s timer; run again once it is due.
        deadline = time.monotonic() + options["timeout"]
        while not is_terminal(handle.status):
            if time.monotonic() > deadline:
                raise CommandError(
                    f"weft_demo: workflow {handle.id} did not finish within {options['timeout']}s "
                    f"(status {handle.status})."
                )
            run_until_idle()
            time.sleep(0.2)
        result = handle.result(timeout=5)
        self.stdout.write(f"Status: {handle.status}")
        self.stdout.write("Result: " + json.dumps(result, indent=2, sort_keys=True))
