"""The shop's order pipeline: reserve stock, charge the card, wait a moment, send the receipt.

weft imports this module at start-up (every installed app's ``workflows.py`` is autodiscovered).
Activities are where side effects belong; here they only log, so the demo is fast and repeatable.
The workflow itself is a generator: each ``yield`` is one durable step, recorded in the database,
so after a crash the run resumes from its last completed step instead of repeating the charge.

Start it from a view, a shell or a test::

    from example_project.shop.workflows import order_pipeline
    handle = order_pipeline.start(42, "12.00")
    handle.result(timeout=30)  # once an engine (python manage.py weft_engine) has run it
"""

from __future__ import annotations

import logging

import weft_django as weft

logger = logging.getLogger(__name__)

# Explicit, stable names: runs in flight refer to activities and workflows by name, so renaming or
# moving a function later does not strand them.


@weft.activity(name="shop.reserve_stock", timeout="10s")
def reserve_stock(order_id: int) -> dict:
    logger.info("reserving stock order_id=%s", order_id)
    return {"order_id": order_id, "reservation": f"res_{order_id}"}


@weft.activity(
    name="shop.charge_card",
    # A payment provider may time out now and then: try up to 3 times (after 200ms, then 400ms).
    # A ValueError (a malformed amount) will not get better by retrying.
    retry=weft.RetryPolicy(
        max_attempts=3,
        initial_backoff="200ms",
        backoff_multiplier=2.0,
        max_backoff="2s",
        non_retryable=["ValueError"],
    ),
    timeout="30s",
)
def charge_card(order_id: int, amount: str) -> dict:
    # A real provider call would pass weft.activity_info().idempotency_key, which stays the same
    # across attempts, so a retried charge is not taken twice.
    logger.info("charging order_id=%s amount=%s", order_id, amount)
    return {"charge_id": f"ch_{order_id}", "amount": amount}


@weft.activity(name="shop.send_receipt", timeout="10s")
def send_receipt(order_id: int, charge: dict) -> str:
    logger.info("sending receipt order_id=%s charge_id=%s", order_id, charge["charge_id"])
    return f"receipt_{order_id}"


@weft.workflow(name="shop.order_pipeline")
def order_pipeline(ctx: weft.WorkflowContext, order_id: int, amount: str):
    reservation = yield ctx.run(reserve_stock, order_id)
    charge = yield ctx.run(charge_card, order_id, amount)
    yield ctx.sleep("1s")  # a durable timer: survives restarts, like a cooling-off period
    receipt = yield ctx.run(send_receipt, order_id, charge)
    ctx.log.info("order done order_id=%s", order_id)
    return {
        "order_id": order_id,
        "reservation": reservation["reservation"],
        "charge_id": charge["charge_id"],
        "receipt": receipt,
    }


@weft.workflow(name="shop.order_with_approval")
def order_with_approval(ctx: weft.WorkflowContext, order_id: int, amount: str):
    """The pipeline with a person in the loop (``python manage.py weft_demo`` runs it): after the charge
    it waits for an "approve" signal, then a durable 2 s timer, then sends the receipt."""
    reservation = yield ctx.run(reserve_stock, order_id)
    charge = yield ctx.run(charge_card, order_id, amount)
    approval = yield ctx.wait_for_signal("approve", timeout="1h")  # a payload such as {"by": "alice"}
    yield ctx.sleep("2s")  # a durable timer: recorded in the database, fires even after a restart
    receipt = yield ctx.run(send_receipt, order_id, charge)
    return {
        "order_id": order_id,
        "reservation": reservation["reservation"],
        "charge_id": charge["charge_id"],
        "approved_by": approval["by"],
        "receipt": receipt,
    }
