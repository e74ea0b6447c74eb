"""The chaos tests' fixtures: a hand-made ledger for the checker, the network-namespace hosts and
the supervisors started inside them, and the wall-clock shift's check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from faults import APP, HEARTBEAT_MS, POLL_MS, SupervisorProcess, needs
from supervisor.chaos import netns as multihost
from supervisor.chaos import wall_clock
from test_chaos import Ledger
from test_hosts_partition import LEASE_MS, RENEW_MS


@pytest.fixture
def chaos_ledger(tmp_path, clock):
    """A small SQLite ledger written through the real API on the fake clock, and its evidence
    folder (see `test_chaos.Ledger`)."""
    made = Ledger(tmp_path, clock)
    yield made
    made.backend.close()


@pytest.fixture
def needs_the_shim():
    needs(wall_clock.available(), "wall-clock tests")


@pytest.fixture
def hosts():
    needs(multihost.available(), "multi-host tests")
    with multihost.Hosts(2) as made:
        yield made


@pytest.fixture
def start_on(hosts, supervisors, tmp_path):
    """Start `yieldstar supervise` inside a host's namespace (with `env`, if given), on the
    database as that host reaches it; the `supervisors` fixture kills what is left of it (before
    the hosts go)."""
    def start(host: multihost.Host, uri: str, *, concurrency: int = 2, env=None) -> SupervisorProcess:
        args = [sys.executable, "-m", "supervisor.cli", "--db", host.uri(uri), "supervise", APP,
                "--concurrency", str(concurrency), "--lease-ms", str(LEASE_MS), "--renew-ms", str(RENEW_MS),
                "--heartbeat-ms", str(HEARTBEAT_MS), "--poll-ms", str(POLL_MS)]
        log_path = tmp_path / f"host-{host.index}-supervisor.log"
        with open(log_path, "wb") as log:
            popen = host.popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                               start_new_session=True, env=env)
        process = SupervisorProcess(popen, log_path, concurrency)
        supervisors.started.append(process)
        process.wait_ready()
        assert set(process.workers()) <= set(host.pids()), "a worker runs outside its host's namespace"
        return process
    return start
