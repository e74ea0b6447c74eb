"""The order shop from RFC 002, as workflows, with a fake payment provider.

This is the app `yieldstar demo` supervises (and a readable example of the SDK). The provider
is a file of charges shared by every process, locked with flock: it honours idempotency keys
like a real one, so a second charge request with the same key returns the first charge instead
of charging again. It can be slow ("having a bad day"), and it can pause between charging and
answering, which is the window in which the demo freezes a worker.
"""

from __future__ import annotations

import fcntl
import json
import os
import time

from worker import workflow


class PaymentProvider:
    """Charges recorded one JSON line each in `path`."""

    def __init__(self, path: str):
        self.path = path

    def charges(self) -> list[dict]:
        try:
            with open(self.path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def charge(self, idempotency_key: str, amount: int, *, seconds: float = 0.0,
               pause_after_charging: float = 0.0) -> dict:
        """Charge `amount` once per idempotency key; a repeat returns the first charge."""
        time.sleep(seconds)  # the provider thinking it over
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            for line in f:
                if line.strip():
                    earlier = json.loads(line)
                    if earlier["idempotency_key"] == idempotency_key:
                        # A repeat gets exactly the first answer, as the idempotency contract says.
                        return {"charge_id": earlier["charge_id"], "amount": earlier["amount"]}
            charge = {"charge_id": f"ch_{len(self.charges()) + 1}", "idempotency_key": idempotency_key,
                      "amount": amount, "pid": os.getpid(), "at": time.time()}
            f.write(json.dumps(charge) + "\n")
            f.flush()
        # The card is charged; the answer has not reached the worker yet.
        time.sleep(pause_after_charging)
        return {"charge_id": charge["charge_id"], "amount": amount}


def load_order(order_id: int) -> dict:
    return {"order_id": order_id, "amount": 1999, "items": ["tea", "cups"]}


def pack(order: dict, ticks_path: str, ticks: int) -> int:
    """A slow step that leaves a trace every 100 ms, so anyone can see when it stops."""
    for i in range(ticks):
        with open(ticks_path, "a") as f:
            f.write(f"{os.getpid()} {time.time()}\n")
        time.sleep(0.1)
    return ticks


@workflow("order")
def order(ctx, input: dict) -> dict:
    """Load the order, charge the card (an effect: once, whatever happens), maybe pack it."""
    provider = PaymentProvider(input["provider"])
    details = ctx.run("load", load_order, input["order_id"])
    receipt = ctx.effect("charge", lambda effect_id: provider.charge(
        effect_id, details["amount"], seconds=input.get("charge_seconds", 0.0),
        pause_after_charging=input.get("pause_after_charging", 0.0)))
    if input.get("pack_ticks"):
        ctx.run("pack", pack, details, input["ticks_path"], input["pack_ticks"])
    return {"order_id": details["order_id"], "charge_id": receipt["charge_id"]}
