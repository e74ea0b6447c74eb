"""The child's watch on its supervisor: the write door follows the lease the ledger confirmed.

A supervisor cut off from the database is still alive and still beats its children; what it
can no longer do is renew. Each run order and beat says until when the ledger has confirmed the
running delivery's lease (`held_until`, on the monotonic clock parent and child share), and the
child's door shuts once that moment passes, whatever the beats say about the supervisor.
These run the watch in a child process of the test, on a real pipe, with the test as its supervisor.
"""

from __future__ import annotations

import os
import queue
import time
from multiprocessing import Pipe, get_context

import pytest

from worker.parent_watch import ParentWatch
from worker.protocol import ALIVE, BEAT, RUN

pytestmark = pytest.mark.timeout(30)

HEARTBEAT_S = 0.05
MISSES = 1000  # the supervisor is never taken for gone here: only the lease decides


@pytest.fixture
def watch():
    """A child process running the watch on a real pipe, with this process as its supervisor;
    `ask()` says whether its write door is open now. Closing the pipes ends it (the watch
    leaves when its pipe closes), and the test makes sure it did."""
    parent, child = Pipe()
    questions, answers = Pipe()
    process = get_context("spawn").Process(target=serve_watch, args=(child, answers, os.getpid()), daemon=True)
    process.start()
    child.close()
    answers.close()

    def ask() -> bool:
        questions.send("may_write?")
        assert questions.poll(10), "the watch process did not answer"
        return questions.recv()

    yield parent, ask
    parent.close()
    questions.close()
    process.join(10)
    assert not process.is_alive()


def serve_watch(conn, answers, parent_pid: int) -> None:
    tasks: "queue.Queue" = queue.Queue()
    watch = ParentWatch(conn, parent_pid, HEARTBEAT_S, MISSES, tasks)
    watch.start()
    while True:
        try:
            answers.recv()
        except EOFError:
            return
        answers.send(watch.may_write())


def beat(parent, held_until) -> None:
    parent.send((BEAT, 123, held_until))
    assert parent.poll(10) and parent.recv() == (ALIVE,)  # answered: the beat was read


def test_the_door_shuts_once_the_lease_the_supervisor_confirmed_runs_out_although_it_still_beats(watch):
    parent, ask = watch
    held_until = time.monotonic() + 1.0
    parent.send((RUN, "e", 1, 123, 100, held_until))
    beat(parent, held_until)
    assert ask()
    while time.monotonic() < held_until + 0.1:  # the supervisor keeps beating, but cannot renew
        beat(parent, held_until)
        time.sleep(HEARTBEAT_S)
    assert not ask()
    # A renewal that comes through after all confirms the lease further: the door opens again
    # (the fence still refuses the write if another holder took the execution meanwhile).
    beat(parent, time.monotonic() + 30)
    assert ask()


def test_an_idle_child_holds_no_lease_and_its_door_stays_open(watch):
    parent, ask = watch
    parent.send((RUN, "e", 1, 123, 100, time.monotonic() - 1))  # a lease already unconfirmed
    beat(parent, time.monotonic() - 1)
    assert not ask()
    beat(parent, None)  # between deliveries
    assert ask()
