"""The template process: one interpreter that imports the runtime and the app once, then forks a
worker whenever its supervisor asks (a "fork server", as multiprocessing's forkserver and
gunicorn's preload have).

A fresh interpreter per worker costs about a tenth of a second of CPU for its imports alone; at
hundreds of workers on a small machine that is the whole start-up. A fork of the template costs
a few milliseconds, and the worker starts with the app already imported.

    supervisor --(up to MAX_BATCH socketpair ends, SCM_RIGHTS)--> template
    template --fork--> go-between --fork--> a worker for each end; the go-between exits
    supervisor <--(the workers' pids, once the go-between exited and the supervisor, a child
                   subreaper, adopted them)

Every worker is still its own process with its own pipe, and the supervisor's child: the go-between
exits at once, and the supervisor, which asked to be the child subreaper of what it starts
(`supervisor.template`), adopts the worker. Only then does the worker ask for SIGKILL at its
parent's death and check that its parent is the supervisor (`child_main` → `die_with_parent`),
so it watches the supervisor, never the template, and a template that dies takes no worker with
it. The parent-death signal is not inherited by a fork; the template asks for its own, so that it
too goes when the supervisor does.

A fork is safe only from a process with one thread: the template checks after importing the app,
and an app that starts a thread on import gets no template (its workers are started as fresh
interpreters, as before). One kind of thread is let by: an OpenTelemetry batch span processor's,
which an app that traces starts on import, and which the SDK itself starts anew in each fork
(`tracing.batch_span_processor`); the template flushes it first. Nothing is opened here but the
app: each worker opens its own ledger connection after the fork. What the app itself does when
imported is done once, for every worker (as with gunicorn's preload): a connection it opens at
import is shared by all of them.

The template's command line has `TEMPLATE_FLAG`, which the worker overwrites in place with
`WORKER_FLAG` (same length), so that tools that tell workers by their command line (`ps`,
`supervisor.pool.is_worker_command`) tell the template apart.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from .loading import load_app
from .parent_watch import die_with_parent
from .protocol import EXIT_PARENT_GONE
from .tracing import batch_span_processor

TEMPLATE_FLAG = "--yieldstar-template"
WORKER_FLAG = "--yieldstar-forked--"  # as long as TEMPLATE_FLAG: written over it
PID = struct.Struct("=i")  # the template's answer: the worker's pid, 0 if it could not fork
CAN_FORK, CANNOT_FORK = b"\x01", b"\x00"  # the template's first word: whether it will fork workers
MAX_BATCH = 64  # workers forked by one go-between, at most
ADOPTION_S = 60.0  # a worker waits at most this long for the go-between to exit (a busy machine)


def serve(control_fd: int, app: str, parent_pid: int) -> int:
    """Run the template: returns only in a forked worker, with the descriptor of its pipe."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a worker does: stopping is the supervisor's call
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    try:
        load_app(app)
    except BaseException:  # noqa: BLE001 - each worker imports it again, and reports why it cannot
        pass
    if not _fork_safe():
        control.sendall(CANNOT_FORK)
        os._exit(0)
    control.sendall(CAN_FORK)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1, MAX_BATCH)
        except OSError:
            os._exit(0)
        if not message:  # the supervisor closed its end, or is gone
            os._exit(0)
        if not fds:
            continue
        read_pid, write_pid = os.pipe()
        try:
            go_between = os.fork()
        except OSError:
            go_between = -1
        if go_between == 0:
            os.close(read_pid)
            return _go_between(control, write_pid, fds)
        os.close(write_pid)
        for fd in fds:
            os.close(fd)
        answer = b""
        if go_between > 0:
            # Once the go-between is gone, its workers are the supervisor's children: only then
            # are their pids sent, so that the supervisor never waits for a process not its own.
            os.waitpid(go_between, 0)
            while chunk := os.read(read_pid, 4096):
                answer += chunk
        os.close(read_pid)
        control.sendall(answer[:PID.size * len(fds)].ljust(PID.size * len(fds), b"\0"))  # 0: not forked


def _fork_safe() -> bool:
    """Whether this process may fork workers: it has no thread but this one, or only
    OpenTelemetry's batch span processors, flushed now (`tracing.batch_span_processor`)."""
    processors = []
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            processor = batch_span_processor(thread)
            if processor is None:
                return False
            processors.append(processor)
    for processor in processors:  # spans the app made on import go now, from here, not in a fork
        try:
            processor.force_flush()
        except Exception:  # noqa: BLE001 - an exporter's failure: not ours to report, nor a reason to stop
            pass
    return True


def _go_between(control: socket.socket, write_pid: int, fds: list[int]) -> int:
    """Fork a worker for each pipe in `fds`, write their pids for the template, and exit so that
    the supervisor adopts them. Returns in each worker, with its pipe."""
    me = os.getpid()
    # Closed when this process exits (each worker closes its own copy of the writing end): the
    # workers wait for that end of file without polling, however long the forks of the batch take.
    gone_r, gone_w = os.pipe()
    pids = []
    for fd in fds:
        try:
            worker = os.fork()
        except OSError:
            break
        if worker == 0:
            os.close(gone_w)
            for other in fds:  # another worker's pipe held here would outlive that worker
                if other != fd:
                    os.close(other)
            os.close(write_pid)
            control.close()
            _wait_for_adoption(me, gone_r)
            _rename_as_worker()
            return fd
        pids.append(worker)
    os.write(write_pid, b"".join(PID.pack(pid) for pid in pids))
    os._exit(0)


def _wait_for_adoption(go_between: int, gone: int) -> None:
    """Wait until the go-between has exited (`gone` reads end of file) and this process has a new
    parent: the supervisor (`die_with_parent` checks that it is)."""
    deadline = time.monotonic() + ADOPTION_S
    select.select([gone], [], [], ADOPTION_S)
    os.close(gone)
    # Its descriptors are closed before its children are handed on: moments.
    while os.getppid() == go_between:
        if time.monotonic() > deadline:
            os._exit(EXIT_PARENT_GONE)
        time.sleep(0.0005)


def _rename_as_worker() -> None:
    """Write WORKER_FLAG over TEMPLATE_FLAG in this process's command line (/proc/self/cmdline
    reads the memory its arguments were given in)."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - the template runs on Linux only
        return
    try:
        with open("/proc/self/cmdline", "rb") as file:
            cmdline = file.read()
        with open("/proc/self/stat", "rb") as file:
            stat = file.read()
        arg_start = int(stat[stat.rindex(b")") + 2:].split()[45])  # the 48th field
    except (OSError, ValueError, IndexError):
        return
    flag = TEMPLATE_FLAG.encode() + b"\0"
    at = cmdline.find(b"\0" + flag)
    if at < 0:
        return
    ctypes.memmove(arg_start + at + 1, WORKER_FLAG.encode(), len(WORKER_FLAG))
