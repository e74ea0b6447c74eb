"""A workflow for the parallel-steps test under a real supervisor, loaded by path as its APP.

It leaves evidence as `supervised_app.py`'s workflows do (its side-effect log and gates, whose
helpers it imports from there: an app's own folder is on `sys.path`).
"""

from __future__ import annotations

from supervised_app import log_event, wait_for_file
from worker import workflow


def parallel_item(item: dict) -> int:
    """One item of `par.items`: logs `begin` and `end` as step `item[i]`; the held item waits
    for the gate on the tokens listed in `hold_tokens`."""
    key = f"item[{item['i']}]"
    log_event(item["log"], "begin", item["execution_id"], item["token"], key)
    if item["held"] and item["token"] in item["hold_tokens"]:
        wait_for_file(item["gate"])
    log_event(item["log"], "end", item["execution_id"], item["token"], key)
    return item["i"] * 10


@workflow("par.items")
def parallel(ctx, input):
    """`ctx.parallel` over `input["n"]` items, the last one held on `input["hold_tokens"]`."""
    n = input["n"]
    items = [{"i": i, "held": i == n - 1, "log": input["log"], "gate": input["gate"], "token": ctx.token,
              "execution_id": ctx.execution_id, "hold_tokens": input["hold_tokens"]} for i in range(n)]
    return ctx.parallel("item", parallel_item, items)
