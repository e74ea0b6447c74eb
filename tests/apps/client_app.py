"""Workflows for the application client's tests (`tests/worker/test_client.py`), loaded by path as a
supervisor's APP. Names start with `cl.` so they cannot clash with other apps."""

from __future__ import annotations

import os
import time

from worker import workflow

GATE_TIMEOUT_S = 60.0


def echo_step(value):
    return value


def wait_for_file(path: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} did not appear within {GATE_TIMEOUT_S} s")
        time.sleep(0.01)


def refuse(order_id):
    raise ValueError(f"order {order_id} cannot be charged")


@workflow("cl.echo")
def echo(ctx, input):
    """One step that returns the input: the latency benchmark's unit of work."""
    return ctx.run("echo", echo_step, input)


@workflow("cl.fail")
def fail(ctx, input):
    """One step that raises, and the workflow lets the error out."""
    return ctx.run("charge", refuse, input["order_id"])


@workflow("cl.gated")
def gated(ctx, input):
    """Returns `input["value"]` once the file `input["gate"]` exists (a step, so it runs once)."""
    ctx.run("gate", wait_for_file, input["gate"])
    return input["value"]
