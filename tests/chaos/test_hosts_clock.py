"""Two hosts on one PostgreSQL server, one of whose wall clocks is 30 s wrong (issue 14, SPEC
section 7: the server's clock is the only clock that decides).

Each host is a Linux network namespace (`supervisor.chaos.netns`) running a real
`yieldstar supervise`. Host B's supervisor, and so its workers, run with a wall clock really
shifted (`supervisor.chaos.wall_clock`: an LD_PRELOAD library under libc's `clock_gettime`,
`gettimeofday` and `time`, so every library in those processes reads the wrong time, not only
the code a patch would know about). Host A holds an execution inside a step and renews its
lease. With B 30 s ahead, B never takes that live lease over however long A holds it; when A's
supervisor is killed, B takes the execution over one lease and the redelivery delay later by the
server's clock, not 30 s early; with B 30 s behind, not 30 s late. Each test first proves the
shift took: the library is mapped in B's supervisor and workers, B's supervisor stamps its log
30 s off, and a step B's worker ran logs a wall-clock time 30 s away from the time the ledger
recorded for that step.

Needs root and `ip` (CI runs as root), and gcc: otherwise the tests are skipped with a message,
and under `CI=true` that skip is a failure. Everything started is killed and removed afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from typing import Optional

import pytest

from faults import SupervisorProcess, admit, no_two_live_leases, query, read_log, step_tokens, wait_gone, wait_until
from supervisor import open_backend
from supervisor.chaos import wall_clock
from test_hosts_partition import LEASE_MS, REDELIVERY_MS, outcomes  # the supervisors' timings too

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dump_on_hang", "needs_the_shim")]

SKEW_MS = 30_000
# How late, by the server's clock, a takeover may come after the lease and the redelivery delay
# ran out (B's poll interval, its server-clock estimate's lag, a loaded 2-core machine): far
# below the skew, so a takeover decided by B's wall clock could not pass for one on time.
TAKEOVER_SLACK_MS = 4000
# How far a worker's wall-clock reading before a step may be from the step's record (the
# server's clock): the time between the two on a loaded machine, far below the skew.
RECORD_SLACK_MS = 3000


def offsets(process: SupervisorProcess) -> set[Optional[str]]:
    """The offsets a supervisor's and its workers' environments ask for, each where the shift's
    library is mapped in the process, else None (a worker that exits meanwhile is passed over)."""
    found = set()
    for pid in [process.pid, *process.workers()]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry)
            with open(f"/proc/{pid}/maps") as f:
                mapped = wall_clock.library() in f.read()
        except FileNotFoundError:
            assert pid != process.pid, f"supervisor {pid} is gone"
            continue
        offset = env.get(wall_clock.OFFSET_VARIABLE.encode())
        found.add(offset.decode() if mapped and offset is not None else None)
    return found


def wall_clock_minus_record_ms(uri: str, log, execution_id: str, token: int, step_key: str) -> int:
    """How far ahead of the ledger's record of a step (the server's clock) the wall clock of the
    worker that ran it read, when it logged the step's end just before writing the record."""
    (end,) = [e for e in read_log(log)
              if (e.event, e.execution_id, e.token, e.step_key) == ("end", execution_id, token, step_key)]
    ((written_at,),) = query(uri, "SELECT written_at FROM steps WHERE execution_id = $p AND token = $p AND step_key = $p",
                             execution_id, token, step_key)
    return end.time_ns // 1_000_000 - written_at


def first_logged_at(process: SupervisorProcess) -> float:
    """The wall-clock time (the supervisor's own) of its first line in its log."""
    stamp = re.search(rf"^(.+?) yieldstar\[{process.pid}\] ", process.log(), re.MULTILINE).group(1)
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("skew_ms, watched_leases", [(SKEW_MS, 3), (-SKEW_MS, 1)], ids=["ahead", "behind"])
def test_a_host_whose_wall_clock_is_30_s_off_never_takes_a_live_lease_and_takes_a_dead_one_over_on_time(
        hosts, start_on, tmp_path, skew_ms, watched_leases):
    a, b = hosts
    uri = hosts.cluster.new_database()  # the test's own view: the server's Unix socket
    log, gate = tmp_path / "effects.log", tmp_path / "gate"
    admit(uri, "held", "sv.hold", {"log": str(log), "gate": str(gate), "hold_tokens": [1]})

    starting_a = time.time()
    first = start_on(a, uri, concurrency=1)
    wait_until(lambda: any((e.event, e.execution_id) == ("waiting", "held") for e in read_log(log)), timeout=30,
               message="host A to hold the execution inside its step")
    starting_b = time.time()
    second = start_on(b, uri, concurrency=1, env=wall_clock.shifted_env(skew_ms))
    b_ready = time.time()

    # The shift took in B's processes, and in none of A's: B's supervisor stamps its log with
    # its own wall clock.
    assert starting_b - 1 <= first_logged_at(second) - skew_ms / 1000 <= b_ready + 1, (starting_b, second.log())
    assert starting_a - 1 <= first_logged_at(first) <= b_ready + 1, (starting_a, first.log())
    assert offsets(second) == {str(skew_ms)} and offsets(first) == {None}
    # A's one worker is busy: B runs the probe, and its worker's clock reads the skew off the server's.
    admit(uri, "probe", "sv.steps", {"log": str(log), "steps": 1})

    with open_backend(uri) as ledger:
        wait_until(lambda: ledger.executions.get("probe").status == "completed", timeout=30,
                   message="host B to run the probe")
        assert ledger.executions.history("probe")[-1].holder.endswith(f":{second.pid}")
        probe_skew = wall_clock_minus_record_ms(uri, log, "probe", 1, "s0")
        assert abs(probe_skew - skew_ms) < RECORD_SLACK_MS, probe_skew

        # A renews its lease for several leases by the server's clock; B, polling all along,
        # never takes it (30 s ahead, every lease of A would look expired on B's own clock).
        (lease,) = ledger.executions.history("held")
        watch_until = lease.expires_at + watched_leases * LEASE_MS

        def a_still_holds_it_and_has_renewed() -> bool:
            history = ledger.executions.history("held")
            assert len(history) == 1, f"host B took a lease host A was renewing: {history}"
            (now,) = history
            assert (now.token, now.ended_by) == (1, None) and now.holder.endswith(f":{first.pid}"), now
            assert second.popen.poll() is None, second.log()
            return now.expires_at >= watch_until

        wait_until(a_still_holds_it_and_has_renewed, timeout=watched_leases * LEASE_MS / 1000 + 20, interval=0.05,
                   message=f"host A to renew its lease through {watched_leases} leases")
        assert {token for _, _, token in step_tokens(uri, "held")} == {1}

        # A's supervisor dies; its worker follows it; B takes over once the lease and the
        # redelivery delay have run out by the server's clock.
        workers_of_a = first.workers()
        os.kill(first.pid, signal.SIGKILL)
        killed_at, killed_at_server = time.monotonic(), ledger.clock()
        assert first.wait(10) == -signal.SIGKILL
        wait_gone(workers_of_a)
        wait_until(lambda: len(ledger.executions.history("held")) == 2, timeout=(LEASE_MS + REDELIVERY_MS) / 1000 + 30,
                   interval=0.05, message="host B to take the execution over")
        taken_after = time.monotonic() - killed_at
        wait_until(lambda: ledger.executions.get("held").status == "completed", timeout=30,
                   message="host B to complete the execution")

        history = ledger.executions.history("held")
        no_two_live_leases(history)
        assert outcomes(ledger, "held") == [(1, "superseded", None), (2, "acknowledged", "completed")]
        dead, taken = history
        assert taken.holder.endswith(f":{second.pid}")
        # By the server's clock: A's lease was live when A died, and B claimed after it expired
        # and the redelivery delay passed, but not much later (30 s behind, B would wait 30 s more).
        assert dead.expires_at > killed_at_server, (killed_at_server, dead)
        assert dead.expires_at + REDELIVERY_MS <= taken.claimed_at <= (dead.expires_at + REDELIVERY_MS
                                                                       + TAKEOVER_SLACK_MS), history
        assert taken.claimed_at - killed_at_server <= LEASE_MS + REDELIVERY_MS + TAKEOVER_SLACK_MS, history
        assert REDELIVERY_MS / 1000 <= taken_after <= (LEASE_MS + REDELIVERY_MS + TAKEOVER_SLACK_MS) / 1000, taken_after
        # Each step recorded once: A's before B's takeover, B's after it.
        assert step_tokens(uri, "held") == [("before", 1, 1), ("hold", 1, 2), ("after", 1, 2)]
        taken_skew = wall_clock_minus_record_ms(uri, log, "held", 2, "after")
        assert abs(taken_skew - skew_ms) < RECORD_SLACK_MS, taken_skew

    print(f"B's clock {skew_ms:+d} ms: took over {taken_after:.2f} s after A was killed, claimed"
          f" {taken.claimed_at - dead.expires_at} ms after A's lease expired by the server's clock (lease {LEASE_MS} ms,"
          f" redelivery {REDELIVERY_MS} ms); B's workers read the wall clock {probe_skew} and {taken_skew} ms off the"
          f" ledger's records")
