"""Two hosts on one PostgreSQL server, and a network partition (issue 14, SPEC section 7).

Each host is a Linux network namespace joined to the server by a veth pair
(`supervisor.chaos.netns`), and runs a real `yieldstar supervise` inside it that
reaches the database over TCP at the server's address on its own veth. Host A holds two
executions mid-delivery: one inside a step (`sv.hold`), one whose steps are all recorded
(`sv.finish_late`), let go right after the cut so that its acknowledgement leaves on the dead
link. A's link is taken down. A's supervisor cannot renew: once a lease has gone unconfirmed for
its whole length it kills the worker still inside a step, before host B may claim anything. B
takes both over once their leases expire and completes them. The link heals: A's
acknowledgement, and the late step write and acknowledgement a process of A still makes with
the old lease, are refused by the fencing token; the steps, the lease history and the results
stay B's. A then works on without a restart.

Needs root and `ip` (CI runs as root): otherwise the test is skipped with a message, and under
`CI=true` that skip is a failure. Nothing listens beyond the veths the test made, and every
process is started inside a namespace it made; all of it is removed afterwards.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from faults import admit, gone, no_two_live_leases, read_log, step_tokens, wait_until
from supervisor import open_backend

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("dump_on_hang")]

LEASE_MS = 3000
RENEW_MS = 500
REDELIVERY_MS = 1000  # the ledger's redelivery delay after an unacknowledged delivery
# A write on a cut link waits for its TCP retransmissions; `tcp_user_timeout` (10 s,
# supervisor/ledger/postgres/connection.py) ends it as a storage error after that.
TCP_USER_TIMEOUT_S = 10


def outcomes(ledger, execution_id: str) -> list[tuple[int, str, str]]:
    return [(h.token, h.ended_by, h.outcome) for h in ledger.executions.history(execution_id)]


def event(log: Path, name: str, execution_id: str, token: int):
    return next((e for e in read_log(log) if (e.event, e.execution_id, e.token) == (name, execution_id, token)), None)


# A stale holder's late writes, made from inside the cut-off host once it is healed: the step
# the killed worker would have recorded next, and an acknowledgement of the delivery.
LATE_WRITES = """
import json, sys
from supervisor import Completed, ExecutionLease, open_backend
uri, execution_id, expires_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
lease = ExecutionLease(execution_id, 1, expires_at)
with open_backend(uri) as ledger:
    step = ledger.heap.write_step(lease, step_key="after", step_attempt=1, done=True, step_response_json="1")
    ack = ledger.executions.acknowledge(lease, Completed(json.dumps({"token": 1})))
print(json.dumps([step.status, ack.status]))
"""


@pytest.mark.timeout(150)
def test_a_host_cut_off_mid_step_stops_its_workers_is_taken_over_after_a_lease_and_its_late_writes_are_refused(
        hosts, start_on, tmp_path):
    a, b = hosts
    uri = hosts.cluster.new_database()  # the test's own view: the server's Unix socket
    log = tmp_path / "effects.log"
    gates = {"step": tmp_path / "gate-step", "ack": tmp_path / "gate-ack"}
    # `step` is held inside its step `hold`; `ack` after its last step, so that once let go its
    # only remaining write is its acknowledgement. Only token 1 (host A's delivery) is held.
    admit(uri, "step", "sv.hold", {"log": str(log), "gate": str(gates["step"]), "hold_tokens": [1]})
    admit(uri, "ack", "sv.finish_late", {"log": str(log), "gate": str(gates["ack"]), "hold_tokens": [1]})
    ids = ("step", "ack")

    first = start_on(a, uri)
    held = {eid: wait_until(lambda eid=eid: event(log, "waiting", eid, 1), timeout=30, message=f"{eid} held on A")
            for eid in ids}
    stale = {eid: e.pid for eid, e in held.items()}
    assert set(stale.values()) <= set(first.workers())
    second = start_on(b, uri)

    with open_backend(uri) as ledger:
        a.partition()
        cut_at = time.monotonic()
        # A's `ack` worker finishes now: its supervisor's acknowledgement leaves on the dead link.
        gates["ack"].touch()
        wait_until(lambda: event(log, "finishing", "ack", 1), timeout=10, message="A's ack worker to finish")

        # A's supervisor cannot renew; once a lease has gone unconfirmed for its whole length it
        # kills the worker still inside a step, before any other host may claim the execution.
        # Both are watched in one loop, so that the order in which they are seen is the order in
        # which they happened (give or take one turn of it).
        seen: dict[str, float] = {}

        def stopped_and_taken_over() -> bool:
            at = time.monotonic() - cut_at
            if "stopped" not in seen and gone(stale["step"]):
                seen["stopped"] = at
            for eid in ids:
                if eid not in seen and any(h.token == 2 for h in ledger.executions.history(eid)):
                    seen[eid] = at
            return len(seen) == 1 + len(ids)

        wait_until(stopped_and_taken_over, timeout=LEASE_MS / 1000 + REDELIVERY_MS / 1000 + 20, interval=0.02,
                   message="A's worker to stop and host B to take over both executions")
        stopped_after, taken_at = seen.pop("stopped"), seen
        assert f"execution step token 1: no renewal has confirmed its lease for {LEASE_MS} ms" in first.log()
        # A's worker had stopped before B began: the step never ran on two hosts at once.
        assert stopped_after < taken_at["step"], (stopped_after, taken_at)
        wait_until(lambda: all(ledger.executions.get(eid).status == "completed" for eid in ids), timeout=20,
                   message="host B to complete both executions")
        taken_over_records = {eid: outcomes(ledger, eid) for eid in ids}
        for eid in ids:
            assert taken_over_records[eid] == [(1, "superseded", None), (2, "acknowledged", "completed")]
            history = ledger.executions.history(eid)
            no_two_live_leases(history)
            first_lease, second_lease = history
            assert first_lease.holder.endswith(f":{first.pid}") and second_lease.holder.endswith(f":{second.pid}")
            # By the server's clock, B claimed once A's lease (live at the cut, renewed until it)
            # had expired and the redelivery delay had passed; by the test's, about a lease after the cut.
            assert second_lease.claimed_at >= first_lease.expires_at + REDELIVERY_MS, history
            assert REDELIVERY_MS / 1000 <= taken_at[eid] <= (LEASE_MS + REDELIVERY_MS) / 1000 + 5, taken_at
        results = {eid: ledger.executions.get(eid).result_json for eid in ids}
        assert all(json.loads(result)["token"] == 2 for result in results.values())
        steps = {eid: step_tokens(uri, eid) for eid in ids}
        assert steps == {"step": [("before", 1, 1), ("hold", 1, 2), ("after", 1, 2)],
                         "ack": [("before", 1, 1), ("after", 1, 1)]}
        assert "delivery execution=" not in first.log()  # A settled nothing while cut off
        assert first.popen.poll() is None, f"host A's supervisor died while cut off:\n{first.log()}"

        # Heal. A's acknowledgement, on its way since the cut, is refused by the token.
        gates["step"].touch()
        a.heal()
        healed_after = time.monotonic() - cut_at
        first.wait_log("delivery execution=ack token=1 outcome=lost", timeout=TCP_USER_TIMEOUT_S + 20)
        # So is every late write a process of host A still makes with the old lease.
        late = a.run([sys.executable, "-c", LATE_WRITES, a.uri(uri), "step",
                      str(ledger.executions.history("step")[0].expires_at)],
                     capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert late.returncode == 0, late.stderr
        assert json.loads(late.stdout) == ["lost", "lost"]
        assert first.popen.poll() is None and second.popen.poll() is None
        # Nothing A did counted: the records and the outcomes are B's.
        assert {eid: outcomes(ledger, eid) for eid in ids} == taken_over_records
        assert {eid: ledger.executions.get(eid).result_json for eid in ids} == results
        assert {eid: step_tokens(uri, eid) for eid in ids} == steps
        assert not any(e.token == 1 and e.step_key == "after" for e in read_log(log) if e.execution_id == "step")

        # A carries on without a restart: with B stopped, it alone runs what comes next.
        second.signal(signal.SIGTERM)
        assert second.wait(30) == 0, second.log()
        admit(uri, "later", "sv.steps", {"log": str(log), "steps": 2})
        wait_until(lambda: ledger.executions.get("later").status == "completed", timeout=TCP_USER_TIMEOUT_S + 20,
                   interval=0.05, message="host A to run a new execution after healing")
        assert ledger.executions.history("later")[-1].holder.endswith(f":{first.pid}")

    print(f"A's worker stopped {stopped_after:.1f} s after the cut; takeover after the cut: {taken_at} s"
          f" (lease {LEASE_MS} ms, redelivery {REDELIVERY_MS} ms); healed {healed_after:.1f} s after the cut")
