"""The hosts of a `yieldstar chaos --hosts N` run, and the faults that hit a whole host or the
server: a partition, a frozen host, a server restart.

    harness (root namespace)                              host 0 (its own network namespace)
    reads the ledger on the server's Unix socket          supervisor + workers -> 10.231.B.1
    PostgreSQL (the run's own) on 10.231.B.1, .5, ...     host 1: supervisor + workers -> 10.231.B.5
               and its Unix socket; nothing else           ...

`RunHosts` makes the hosts and the server (`supervisor.ledger.postgres.hosts.Hosts`: one network
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
keeps ticking while the server is down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Optional

import psutil

from ..ledger.postgres import cluster as clusters
from ..ledger.postgres.hosts import Hosts, available
from . import faults

__all__ = ["RunHosts", "ServerRestart", "available", "freeze", "thaw"]

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
