"""Workflows for supervisor-level tests of starts (and their neighbours), loaded by path as a
supervisor's APP: `yieldstar supervise tests/apps/neighbours_app.py`.

Every workflow is an importable top-level function registered on `worker.default_registry`, with
a name starting `nb.` so that it cannot clash with other apps. They leave evidence outside the
ledger for the test to watch:

- a **log** (`input["log"]`): one line per event, `<event> <execution_id> <token> <pid>`, each
  written with a single `O_APPEND` write so that lines from concurrent processes never mix;
- a **marker** (`input["marker"]`): a step that must wait for the test polls for the file to
  appear, with a deadline, so that a forgotten marker fails the step instead of hanging a test.
"""

from __future__ import annotations

import os
import time

from worker import StepFailed, workflow

MARKER_TIMEOUT_S = 60.0


class CardDeclined(Exception):
    """The child's failure, carried to its parent by type and message."""


def log_event(log: str, event: str, execution_id: str, token: int) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{event} {execution_id} {token} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def wait_for_marker(marker: str, log: str, execution_id: str, token: int) -> bool:
    log_event(log, "waiting", execution_id, token)
    deadline = time.monotonic() + MARKER_TIMEOUT_S
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            raise TimeoutError(f"marker {marker} did not appear within {MARKER_TIMEOUT_S} s")
        time.sleep(0.01)
    log_event(log, "marked", execution_id, token)
    return True


@workflow("nb.parent")
def parent(ctx, input: dict) -> dict:
    """Start one child, wait for its outcome, and report it."""
    child_id = ctx.start("child", "nb.child", input["child"])
    try:
        result = ctx.wait_for(child_id)
    except StepFailed as exc:
        return {"child": child_id, "failed": {"type": exc.error_type, "message": exc.error_message}}
    return {"child": child_id, "result": result}


@workflow("nb.child")
def child(ctx, input: dict) -> dict:
    """Block in a step until the marker appears; then pack the order, or decline the card."""
    ctx.run("wait-marker", wait_for_marker, input["marker"], input["log"], ctx.execution_id, ctx.token)
    if input.get("decline"):
        raise CardDeclined(input["decline"])
    return {"packed": input["order"]}
