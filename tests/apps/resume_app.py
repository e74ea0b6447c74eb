"""A workflow with a bug that a test can fix: `rs.order` fails at step `charge` while the file
`input["bug"]` exists. Each step that really runs appends its name to `input["log"]`."""

from __future__ import annotations

import os

from worker import workflow


def logged(log: str, name: str) -> str:
    with open(log, "a") as f:
        f.write(name + "\n")
    if name == "charge" and os.path.exists(log + ".bug"):
        raise ValueError("card number missing")
    return name


@workflow("rs.order")
def order(ctx, input):
    return [ctx.run(name, logged, input["log"], name) for name in ("reserve", "charge", "ship")]
