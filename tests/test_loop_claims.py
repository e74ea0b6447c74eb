"""The dispatcher loop's claims, driven by hand: a worker freed while a claim is in flight is
claimed for at once, by a claim of its own, and no worker is claimed for twice.

Real ledger threads on a real SQLite file; the workers are the supervisor's ends of socket pairs
(what the loop sends them is read back from the other ends).
"""

from __future__ import annotations

import socket
import subprocess
import time
from multiprocessing.connection import Connection

import pytest

from faults import APP, admit, db, ledger, wait_until
from supervisor import open_backend
from supervisor.dispatcher import Stats, SupervisorConfig
from supervisor.ledger_calls import LedgerCalls, Wakeup
from supervisor.loop import DispatchLoop
from supervisor.pool import Child, ChildProcess, Delivery, Pool
from worker.protocol import RUN

pytestmark = pytest.mark.timeout(60)

__all__ = ["db", "ledger"]  # fixtures imported from faults


@pytest.fixture
def loop(db):
    """A loop over two idle workers (`loop.workers`: the other ends of their pipes)."""
    exited = subprocess.Popen(["true"])  # stands in for the workers' processes, which the loop never waits on here
    exited.wait()
    pool = Pool(2, app=APP, db_path=str(db), durability="normal", heartbeat_s=1.0, misses=3)
    ends = []
    for _ in range(2):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pool.children.append(Child(ChildProcess(exited), Connection(ours.detach()), exited.pid, ready=True))
        ends.append(Connection(theirs.detach()))
    calls = LedgerCalls(open_backend(str(db)), "test-calls", gathering=True)
    renewals = LedgerCalls(open_backend(str(db)), "test-renewals")
    loop = DispatchLoop(SupervisorConfig(concurrency=2, lease_ms=30_000), Stats(), pool, calls, renewals,
                        db_path=str(db), signals=Wakeup(), stop_requests=lambda: 0)
    loop.workers = ends
    yield loop
    calls.close()
    renewals.close()
    for end in ends:
        end.close()


def handed(end: Connection) -> list[str]:
    """The executions the loop has handed to the worker at `end` so far."""
    out = []
    while end.poll(0):
        message = end.recv()
        if message[0] == RUN:
            out.append(message[1])
    return out


def test_a_worker_freed_while_a_claim_is_in_flight_gets_a_claim_of_its_own(loop, db, ledger):
    for name in ("e1", "e2"):
        admit(db, name, "sv.noop3")
    _, second = loop.pool.children
    second.delivery = Delivery(None, claimed_at=0, held_until=float("inf"))  # busy: not to be claimed for
    now = time.monotonic()
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (1, 1)  # for the one idle worker

    second.delivery = None  # freed while the first claim is in flight
    loop.claim_wanted = True
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (2, 2)  # a second claim, for the freed worker alone
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (2, 2)  # and no third: every idle worker is claimed for
    loop.calls.flush()

    def settled():
        loop.take_replies(time.monotonic())
        return loop.claiming == 0

    wait_until(settled, message="both claims to come back")
    assert loop.promised == 0
    got = [handed(end) for end in loop.workers]
    assert sorted(got) == [["e1"], ["e2"]], got  # one execution each
    assert all(child.busy for child in loop.pool.children)
