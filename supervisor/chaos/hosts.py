"""The hosts of a `yieldstar chaos --hosts N` run, and the faults that hit a whole host or the
server: a partition, a frozen host, a server restart.

    harness (root namespace)                              host 0 (its own network namespace)
    reads the ledger on the server's Unix socket          supervisor + workers -> 10.231.B.1
    PostgreSQL (the run's own) on 10.231.B.1, .5, ...     host 1: supervisor + workers -> 10.231.B.5
               and its Unix socket; nothing else           ...

`RunHosts` makes the hosts and the server (`supervisor.chaos.netns.Hosts`: one network
namespace per host, joined to the server by a veth pair; the server listens on the veths'
database-side addresses and its Unix socket, nowhere else), and a fresh database on it. Each
supervisor of the fleet runs in one host (`Fleet`). At the end `stop()` keeps a dump of the
database in the work folder (`ledger.dump`: `pg_restore` it into any database to study the run,
or to run the checker on it again) and tears everything down: processes inside the namespaces,
the server, the veths and the namespaces. A run killed before its teardown leaves them behind;
the next run removes them (`Hosts` does).

The faults: `partition` takes the database's end of one host's veth down (the host loses its
carrier: TCP segments are dropped, nothing is reset, as when a real network fails) and up again;
`frozen_host` SIGSTOPs every process inside one host's namespace, then SIGCONTs the same
processes (`freeze`, `thaw`); `server_restart` stops the server with a fast shutdown (every
session is terminated) and starts it again, on a thread (`ServerRestart`), so that the harness
keeps ticking while the server is down. `HostFaults` is the harness's side of them: how it
injects each, keeps track of it, and journals it once it is over (a partition once healed, a
restart once the server is up), with its real times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Optional

import psutil

from . import cluster as clusters
from .netns import Hosts, available
from . import faults
from .faults import FaultKind
from .fleet import FROZEN, RUNNING

__all__ = ["HostFaults", "RunHosts", "ServerRestart", "available", "freeze", "thaw"]

DUMP = "ledger.dump"  # in the work folder
START_ATTEMPTS = 5  # a server that does not start is tried again, this many times in all


class RunHosts:
    """`count` hosts and the run's own PostgreSQL server, with one fresh database on it."""

    def __init__(self, count: int) -> None:
        self.made = Hosts(count)
        self.database: Optional[str] = None  # its URI on the Unix socket: the harness's own way in

    @property
    def hosts(self) -> list:
        return self.made.hosts

    @property
    def cluster(self) -> clusters.Cluster:
        return self.made.cluster

    def start(self) -> str:
        """Make the hosts, start the server, create the run's database; its URI on the Unix socket."""
        self.made.start()
        try:
            self.database = self.cluster.new_database()
        except BaseException:
            self.made.stop()
            raise
        return self.database

    def listening(self) -> list[str]:
        """The TCP addresses the server listens on (`address:port`), read from the system."""
        with open(os.path.join(self.cluster.data, "postmaster.pid")) as f:
            postmaster = psutil.Process(int(f.readline()))
        return sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in postmaster.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN)

    def stop(self, folder: Optional[str] = None) -> Optional[str]:
        """Dump the database into `folder` (if given and the server runs), then tear everything
        down; what went wrong with the dump, if anything."""
        trouble = None
        try:
            if folder is not None and self.database is not None and self.cluster is not None:
                trouble = self._dump(os.path.join(folder, DUMP))
        finally:
            self.made.stop()
        return trouble

    def _dump(self, path: str) -> Optional[str]:
        name = self.database.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
        command = [os.path.join(clusters.PG_BIN, "pg_dump"), "-Fc", "-h", self.cluster.folder, "-U", "postgres", name]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]  # the socket folder is the postgres user's
        with open(path, "wb") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=300)
        if done.returncode != 0:
            return f"pg_dump failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()[-300:]}"
        return None


def freeze(host) -> list[psutil.Process]:
    """SIGSTOP every process inside `host`'s namespace; the processes stopped."""
    stopped = []
    for pid in host.pids():
        try:
            process = psutil.Process(pid)
        except psutil.Error:
            continue
        if faults.send(process, signal.SIGSTOP):
            stopped.append(process)
    return stopped


def thaw(processes: list[psutil.Process]) -> None:
    """SIGCONT the processes `freeze` stopped (those still there: psutil checks their identity)."""
    for process in processes:
        faults.send(process, signal.SIGCONT)


class ServerRestart(threading.Thread):
    """A fast shutdown of the server (every session terminated, the data kept), then a start; the
    times of both, for the checker: while it is down, nobody can write to the ledger."""

    def __init__(self, cluster: clusters.Cluster) -> None:
        super().__init__(name="server-restart", daemon=True)
        self.cluster = cluster
        self.began_ms = 0
        self.stopped_ms = 0
        self.started_ms = 0
        self.error: Optional[str] = None

    def run(self) -> None:
        self.began_ms = time.time_ns() // 1_000_000
        try:
            self.cluster.stop_server("fast")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            self.error = f"the fast shutdown failed: {str(exc)[-300:]}"
        self.stopped_ms = time.time_ns() // 1_000_000
        failures = []
        for _ in range(START_ATTEMPTS):
            try:
                self.cluster.start_server()
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                failures.append(str(exc)[-300:])
                continue
            self.started_ms = time.time_ns() // 1_000_000
            return
        self.error = f"the server did not start again ({len(failures)} attempts): {failures[-1]}"

    def as_params(self) -> dict:
        return {"began_ms": self.began_ms, "stopped_ms": self.stopped_ms, "started_ms": self.started_ms,
                "down_ms": self.started_ms - self.began_ms if self.started_ms else None}


@dataclass
class PendingHeal:
    """A `partition` in progress, journalled once the host is joined again (with its real times)."""

    host: object
    target: dict
    step: Optional[dict]
    seconds: float
    at_s: float
    at_ms: int


@dataclass
class PendingRestart:
    """A `server_restart` in progress, journalled once the server is up again."""

    restart: ServerRestart
    step: Optional[dict]
    at_s: float


class HostFaults:
    """The harness's side of the host faults (`--hosts`): a mixin of `harness.ChaosRun`, whose
    fleet, plan, pending actions and journal it uses."""

    hosts: Optional[RunHosts]
    cut: dict  # host index -> its PendingHeal
    restarts: list  # PendingRestart

    def _hit_host(self, kind: FaultKind, handle, target: dict, step: Optional[dict], now: float) -> None:
        """Cut off or freeze the host of `handle` (a supervisor one of whose workers is, preferably,
        inside a step); heal or thaw it later."""
        host = handle.host
        on_host = [h for h in self.fleet.members() if h.host is host]
        target = dict(target, host=host.index, supervisors=[h.number for h in on_host])
        if kind == FaultKind.PARTITION:
            host.partition()
            seconds = self.plan.partition_s()
            self.cut[host.index] = PendingHeal(host, target, step, seconds, now - self.started,
                                               time.time_ns() // 10**6)
            self.pending.append((now + seconds, lambda: self._heal(host.index)))
            return
        stopped = freeze(host)
        for h in on_host:
            h.state = FROZEN
        seconds = self.plan.freeze_host_s()
        self.pending.append((now + seconds, lambda: self._thaw_host(stopped, on_host)))
        self._record(kind, target, step, {"seconds": round(seconds, 3), "processes": len(stopped)})

    def _heal(self, index: int) -> None:
        pending = self.cut.pop(index)
        pending.host.heal()
        self._record(FaultKind.PARTITION, pending.target, pending.step,
                     {"seconds": round(pending.seconds, 3), "healed_ms": time.time_ns() // 10**6},
                     at_s=pending.at_s, at_ms=pending.at_ms)

    def _thaw_host(self, stopped: list, on_host: list) -> None:
        thaw(stopped)
        for h in on_host:
            if h.state == FROZEN:
                h.state = RUNNING

    def _restart_server(self, desperate: bool) -> bool:
        """A fast shutdown of the server, then a start (on a thread): one at a time, preferably
        while a worker is inside a step."""
        if self.restarts:
            return False
        inside = self._in_step_children(self.fleet.running())
        if not inside and not desperate:
            return False
        step = self.plan.choose(inside)[2].as_dict() if inside else None
        restart = ServerRestart(self.hosts.cluster)
        restart.start()
        self.restarts.append(PendingRestart(restart, step, time.monotonic() - self.started))
        return True

    def _tend_restarts(self, *, all_now: bool = False) -> None:
        """Journal the restarts that are over (with `all_now`, wait for every one)."""
        for pending in [r for r in self.restarts if all_now or not r.restart.is_alive()]:
            self.restarts.remove(pending)
            pending.restart.join()
            if pending.restart.error:
                self._anomaly("server_restart_failed", pending.restart.error)
            self._record(FaultKind.SERVER_RESTART, {"server": "the run's own"}, pending.step,
                         pending.restart.as_params(), at_s=pending.at_s, at_ms=pending.restart.began_ms)
