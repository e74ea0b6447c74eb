"""A user's own workflows under `yieldstar chaos --app` (tests/chaos/test_chaos_app.py, docs/chaos.md):
the workflow, and `chaos_workload(rng, count)`, which says what the harness admits."""

import time

from worker import workflow


def reserve(order_id):
    time.sleep(0.05)
    return {"reserved": order_id}


def charge(order_id, amount):
    time.sleep(0.2)
    return {"charged": amount, "order": order_id}


@workflow("shop.order")
def order(ctx, order):
    ctx.run("reserve", reserve, order["id"])
    ctx.sleep("settle", 0.3)
    return ctx.run("charge", charge, order["id"], order["amount"])


def chaos_workload(rng, count):
    """`count` orders, their amounts drawn from the run's seeded `rng`."""
    return [("shop.order", {"id": n, "amount": rng.randint(1, 100)}) for n in range(count)]
