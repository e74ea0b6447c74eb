"""A fork that reruns only the tail (SPEC section 14), with a real `yieldstar supervise` on each
backend: an execution runs to completion, is forked from its step `b`, and the fork completes
with `a`'s result copied (a not run again) while b, c and the effect after them run again, under
the fork's id; the original is unchanged. The step functions append to a log file when they run
(`tests/apps/fork_app.py`)."""

from __future__ import annotations

import asyncio
import json

import pytest

from faults import TESTS, cli
from supervisor import open_backend
from worker import AsyncClient, Client
from worker._runtime.derived_ids import derived_id

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "fork_app.py")


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def everything_of(db, execution_id: str):
    """What the ledger holds of one execution: its record, steps, lease history and events."""
    with open_backend(db, create=False) as backend:
        return (backend.executions.get(execution_id), backend.heap.steps(execution_id),
                backend.executions.history(execution_id), backend.events.list(execution_id))


def steps_of(db, execution_id: str) -> list[tuple[str, int, object]]:
    done = cli(db, "steps", execution_id, "--json")
    assert done.returncode == 0, done.stderr
    return [(s["step_key"], s["attempt"], s["step_response"]) for s in json.loads(done.stdout)]


@pytest.mark.timeout(120)
def test_a_fork_from_the_cli_reruns_only_the_tail(each_backend, supervisors, tmp_path):
    log = tmp_path / "runs.log"
    supervisors.start(each_backend, app=APP)
    with Client(each_backend) as client:
        original = client.start("fork.three", {"log": str(log)}, id="order-1")
        first = original.result(timeout=60)
    assert lines(log) == ["a", "b", "c", f"notify {derived_id('order-1', 'notify')}"]
    before = everything_of(each_backend, "order-1")

    forked = cli(each_backend, "fork", "order-1", "--from-step", "b", "--id", "order-1-again")
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout == "order-1-again\n"

    with Client(each_backend) as client:
        again = client.handle("order-1-again").result(timeout=60)
    assert again[0] == first[0]  # a's result, copied: a did not run again
    assert again[1] != first[1] and again[2] != first[2]  # b and c made new ones
    assert lines(log)[4:] == ["b", "c", f"notify {derived_id('order-1-again', 'notify')}"]
    assert [key for key, _, _ in steps_of(each_backend, "order-1-again")] == ["a", "@1:set_event:a", "b", "c",
                                                                             "@2:set_event:c", "notify"]
    assert steps_of(each_backend, "order-1-again")[0] == steps_of(each_backend, "order-1")[0]
    # The event a's step set was copied (its set_event step was, so the fork did not set it);
    # the one after the fork point the fork set itself.
    assert json.loads(cli(each_backend, "events", "order-1-again", "--json").stdout) == {"a": first[0],
                                                                                      "c": again[2]}
    assert everything_of(each_backend, "order-1") == before


@pytest.mark.timeout(120)
def test_an_async_client_forks_an_async_workflow_with_an_id_made_for_it(each_backend, supervisors, tmp_path):
    log = tmp_path / "runs.log"
    supervisors.start(each_backend, app=APP)

    async def scenario():
        async with AsyncClient(each_backend) as client:
            original = await client.start("fork.three_async", {"log": str(log)}, id="report-1")
            first = await original.result(timeout=60)
            fork = await original.fork(from_step="c")
            return first, fork.execution_id, await fork.result(timeout=60)

    first, fork_id, again = asyncio.run(scenario())
    assert len(fork_id) == 32 and fork_id != "report-1"  # a new id, made as start makes one
    assert again[:2] == first[:2] and again[2] != first[2]
    assert lines(log) == ["a", "b", "c", "c"]
