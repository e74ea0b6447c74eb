"""The UI's tests' ledger and server: `fill` writes executions in several states into a ledger,
one of them with a lease history in which a holder's lease lapsed and a later claim superseded
it, with a queue with limits, a schedule and a live supervisor; `start_ui` runs `yieldstar ui`
in a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from supervisor import Completed, Failed, open_backend
from supervisor.ledger.ticks import Schedule

MINUTE = 60_000


def claim_in_another_process(db, *, now: int, duration: int, renew_at: int) -> None:
    """Claim the one due execution from a child process, renew its lease once, and exit without
    acknowledging: a holder that froze, whose lease lapses. Its holder is the child's `host:pid`."""
    code = textwrap.dedent(f"""
        from supervisor import open_backend
        with open_backend({str(db)!r}, create=False) as backend:
            (lease,) = backend.executions.claim_due(limit=1, duration={duration}, now={now})
            backend.executions.renew(lease, duration={duration}, now={renew_at})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def fill(db):
    """Write into the ledger at `db` (created when missing), and return `db`:

    - `order-1001` completed: token 1 claimed by another process, renewed once, lapsed and
      superseded; token 2 wrote step `charge` and acknowledged;
    - `order-1002` failed; `order-1003` running (a live lease); `report-7` admitted, due;
    - `mail-1` admitted in queue `emails` (concurrency 2); schedule `nightly`; supervisor
      `vm:42:abc` serving `order`.
    """
    with open_backend(db) as backend:
        now = backend.clock()
        executions = backend.executions
        executions.admit("order-1001", "order", '{"sku": "A-7", "qty": 2}', now=now - 5 * MINUTE)
    claim_in_another_process(db, now=now - 5 * MINUTE + 1000, duration=20_000, renew_at=now - 5 * MINUTE + 11_000)
    with open_backend(db) as backend:
        executions = backend.executions
        (second,) = executions.claim_due(limit=1, duration=10 * MINUTE, now=now - 3 * MINUTE)
        backend.heap.write_step(second, step_key="charge", step_attempt=1, done=True,
                                step_response_json='{"result": {"charged": 2}}')
        executions.acknowledge(second, Completed('{"charged": 2}'), now=now - 3 * MINUTE + 4000)

        executions.admit("order-1002", "order", '{"sku": "B-1"}', now=now - 2 * MINUTE)
        (failing,) = executions.claim_due(limit=1, duration=MINUTE, now=now - 2 * MINUTE + 500)
        executions.acknowledge(failing, Failed('{"type": "KeyError", "message": "B-1"}'), now=now - 2 * MINUTE + 2000)

        executions.admit("order-1003", "order", '{"sku": "C-3"}', now=now - MINUTE)
        executions.claim_due(limit=1, duration=10 * MINUTE, now=now - MINUTE + 500)
        executions.admit("report-7", "report", now=now - 30_000)
        backend.queues.declare("emails", concurrency=2)
        executions.admit("mail-1", "mail", '{"to": "bob"}', queue="emails", key="bob", now=now - 20_000)
        backend.schedules.admit_due([Schedule("nightly", every_ms=60 * MINUTE)], now=now)
        backend.supervisors.register("vm:42:abc", host="vm", pid=42, workflows=["order"], concurrency=4, workers=2,
                                     renew_ms=3_600_000, now=now)
    return db


def start_ui(db, *args: str) -> tuple[subprocess.Popen, str]:
    """`yieldstar --db DB ui ARGS` in a process of its own, and the URL it says it serves."""
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", str(db), "ui", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=30)
        raise AssertionError(f"yieldstar ui exited {process.returncode}: {process.stderr.read()}")
    assert line.startswith("serving the UI of ") and line.rstrip().endswith("(Ctrl-C stops)"), line
    return process, line.split(" at ", 1)[1].split()[0]


def stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
