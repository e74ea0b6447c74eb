"""A worker's several deliveries at once (`worker._runtime.deliveries`), in-process: async ones
as tasks of one event loop, sync ones on threads, each ending in the driver's outcomes, and a
`Stop` that ends one of them alone (`LeaseLost`) while the others run on."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from faults import wait_until
from supervisor import Completed, Failed, LeaseLost, Suspended
from supervisor.ledger.values import ExecutionLease
from worker import Registry
from worker._runtime.deliveries import Deliveries
from worker._runtime.protocol import Done, Run, Stop

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 30_000
registry = Registry()
release = threading.Event()  # what the held workflows wait for
entered: list[str] = []  # a line per held step begun


async def wait_released() -> str:
    entered.append("async")
    while not release.is_set():
        await asyncio.sleep(0.005)
    return "released"


def wait_released_sync() -> str:
    entered.append("sync")
    release.wait(20)
    return "released"


@registry.workflow("async_held")
async def async_held(ctx, input):
    return await ctx.run("held", wait_released)


@registry.workflow("sync_held")
def sync_held(ctx, input):
    return ctx.run("held", wait_released_sync)


@registry.workflow("async_naps")
async def async_naps(ctx, input):
    await ctx.sleep("nap", 60)


@registry.workflow("async_fails")
async def async_fails(ctx, input):
    raise KeyError("no such order")


class Watch:
    """A parent watch's part that `Deliveries` uses: the supervisor's messages, and the reports."""

    def __init__(self):
        self.tasks: queue.Queue = queue.Queue()
        self.sent: queue.Queue = queue.Queue()
        self.handled = -1  # messages taken and acted on: each ask for the next one says so


    def may_write(self) -> bool:
        return True

    def next_task(self):
        self.handled += 1
        return self.tasks.get()

    def send(self, message) -> None:
        self.sent.put(message)


@pytest.fixture
def worker(sqlite_backend):
    release.clear()
    entered.clear()
    watch = Watch()
    deliveries = Deliveries(sqlite_backend, registry, watch, slots=8)
    serving = threading.Thread(target=deliveries.serve, daemon=True)
    serving.start()
    yield watch
    release.set()
    watch.tasks.put(None)  # Exit: the deliveries in hand finish first
    serving.join(20)
    assert not serving.is_alive()


def run(backend, watch: Watch, execution_id: str, workflow: str) -> ExecutionLease:
    backend.executions.admit(execution_id, workflow, "null")
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS)
    watch.tasks.put(Run(lease, lease.expires_at - LEASE_MS, None))
    return lease


def reports(watch: Watch, n: int) -> dict[str, Done]:
    out = {}
    while len(out) < n:
        done = watch.sent.get(timeout=20)
        out[done.execution_id] = done
    return out


def test_async_and_sync_deliveries_end_in_the_drivers_outcomes_side_by_side(sqlite_backend, worker):
    for execution_id, workflow in [("a", "async_held"), ("s", "sync_held"), ("n", "async_naps"),
                                   ("f", "async_fails")]:
        run(sqlite_backend, worker, execution_id, workflow)
    early = reports(worker, 2)  # the two that do not wait for the release end first
    assert isinstance(early["n"].outcome, Suspended) and isinstance(early["f"].outcome, Failed)
    assert "no such order" in early["f"].outcome.error_json
    release.set()
    late = reports(worker, 2)
    assert late["a"].outcome == Completed('"released"') and late["s"].outcome == Completed('"released"')


@pytest.mark.parametrize("workflow", ["async_held", "sync_held"])
def test_a_stop_ends_one_delivery_as_lost_and_the_others_run_on(sqlite_backend, worker, workflow):
    stopped = run(sqlite_backend, worker, "stopped", workflow)
    run(sqlite_backend, worker, "other-async", "async_held")
    run(sqlite_backend, worker, "other-sync", "sync_held")
    wait_until(lambda: len(entered) == 3, message="all three inside their held step")
    worker.tasks.put(Stop("stopped", stopped.token))
    wait_until(lambda: worker.handled == 4, message="the Stop acted on")  # 3 Runs and the Stop
    if workflow == "async_held":  # cancelled at its await: it reports at once
        assert reports(worker, 1)["stopped"].outcome == LeaseLost()
        release.set()
        rest = reports(worker, 2)
    else:  # a sync one stops at its next write: once its step returns
        release.set()
        rest = reports(worker, 3)
        assert rest.pop("stopped").outcome == LeaseLost()
    assert {e: d.outcome for e, d in rest.items()} == {"other-async": Completed('"released"'),
                                                      "other-sync": Completed('"released"')}
    assert sqlite_backend.heap.steps("stopped") == []  # its step's result was not recorded
