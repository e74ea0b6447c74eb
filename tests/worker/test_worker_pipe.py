"""The child's end of the supervisor's pipe (`worker._runtime.pipe.Pipe`) speaks the framing of the
multiprocessing `Connection` at the supervisor's end: messages of any size both ways, poll and
end of pipe as a Connection reports them."""

from __future__ import annotations

import fcntl
import os
import pickle
import socket
import struct
import termios
import threading
from multiprocessing.connection import Connection

import pytest

from faults import wait_until
from supervisor.ledger.ticks import schedule_of
from supervisor.ledger.values import Completed, ExecutionLease, Retry
from worker._runtime.pipe import Pipe
from worker._runtime.protocol import Alive, AppNotLoaded, Beat, Done, Exit, LedgerNotOpened, Ready, Run, Stop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ends():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    supervisor, child = Connection(ours.detach()), Pipe(theirs.detach())
    yield supervisor, child
    supervisor.close()
    try:
        child.close()
    except OSError:
        pass  # closed by the test


MESSAGES = [
    Run(ExecutionLease("e1", 3, 1_700_000_000_000), 1_699_999_970_000, ("wf", '{"a": 1}')),
    Run(ExecutionLease("e1", 4, 1_700_000_000_000), 1_699_999_970_000, None,
        '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'),
    Done("e1", 3, Completed('{"ok": true}'), 12),
    Done("e2", 1, Retry("x" * 100_000), 0),  # larger than one write
    (ExecutionLease("e3", 7, 42), "é" * 20_000),
    Beat(None), Exit(), Alive(), Ready(123, ("order", "refund")), AppNotLoaded(123, "cannot load app x: y"),
    LedgerNotOpened(123, "corrupt", "corrupt"), Stop("e1", 3),
    Ready(123, ("nightly", "tick"), (schedule_of("nightly", schedule="0 3 * * *", timezone="Europe/Paris"),
                                     schedule_of("tick", every=2.0))),
]


@pytest.mark.parametrize("message", MESSAGES, ids=["run", "traced-run", "done", "large", "unicode", "beat", "exit", "alive", "ready",
                                                   "app-not-loaded", "ledger-not-opened", "stop", "ready-with-schedules"])
def test_messages_cross_both_ways_unchanged(ends, message):
    supervisor, child = ends
    supervisor.send(message)
    assert child.poll(5) and child.recv() == message
    child.send(message)
    assert supervisor.poll(5) and supervisor.recv() == message


def test_a_message_larger_than_the_socket_buffer_arrives_whole_while_it_is_read(ends):
    supervisor, child = ends
    message = Done("big", 1, Completed('"' + "y" * 3_000_000 + '"'), 1)
    sender = threading.Thread(target=child.send, args=(message,))
    sender.start()  # blocks until the other end reads: a write of 3 MB does not fit in the buffer
    assert supervisor.recv() == message
    sender.join(10)
    assert not sender.is_alive()


def framed(message) -> bytes:
    """`message` as a multiprocessing Connection writes it: its length, then its pickle."""
    body = pickle.dumps(message)
    return struct.pack("!i", len(body)) + body


def unread(end: Pipe) -> int:
    return struct.unpack("i", fcntl.ioctl(end.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_a_message_that_arrives_in_parts_is_read_whole_and_one_cut_short_is_the_end(ends):
    supervisor, child = ends
    message = Run(ExecutionLease("parts", 1, 0), 0, ("wf", "z" * 10_000))
    data = framed(message)
    got = []
    reader = threading.Thread(target=lambda: got.append(child.recv()))
    reader.start()
    for start in range(0, len(data), 3_000):
        # Each part once the one before is taken: the reader has read it, and waits for more.
        wait_until(lambda: unread(child) == 0, timeout=10, interval=0.001, message="the reader to take a part")
        os.write(supervisor.fileno(), data[start:start + 3_000])
    reader.join(10)
    assert got == [message]

    os.write(supervisor.fileno(), data[:5_000])
    supervisor.close()
    with pytest.raises(EOFError):
        child.recv()


def test_poll_says_whether_a_message_or_the_end_of_the_pipe_is_waiting(ends):
    supervisor, child = ends
    assert not child.poll(0) and not child.poll(0.01)
    supervisor.send(Beat(None))
    supervisor.send(Beat(5))
    assert child.poll(0)
    assert [child.recv(), child.recv()] == [Beat(None), Beat(5)]
    assert not child.poll(0)
    supervisor.close()
    assert child.poll(0)  # the end shows as readable, as in a Connection
    with pytest.raises(EOFError):
        child.recv()


def test_sending_to_a_closed_supervisor_end_raises_oserror(ends):
    supervisor, child = ends
    supervisor.close()
    with pytest.raises(OSError):  # a Unix socket whose peer is closed takes nothing more
        child.send(("alive",))
