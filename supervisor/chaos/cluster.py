"""A throwaway PostgreSQL cluster, for the tests and the benchmarks: `initdb` in a temporary
folder, listening on a Unix socket only (`listen_addresses=''`, socket owner-only), removed
afterwards.

A cluster for several hosts (`supervisor.chaos.netns`) also listens on TCP, on the
addresses it is given and no other: each must be a literal address of one interface (the
database's end of a test's veth pair), never a wildcard, and clients from the `trusted_networks`
given with them connect without a password (`pg_hba.conf`, `trust`). The Unix socket stays.

`initdb` refuses to run as root; as root, every server command runs as the `postgres` user
(`runuser -u postgres --`) in a folder that user owns. Without the server binaries the caller
skips PostgreSQL tests (under `CI=true` a skip is a failure: CI always runs both backends).

A started cluster has a guard (`cluster_guard`) that stops the server and removes its folder if
the process that started it dies without `stop()` (a killed test run): `pg_ctl` starts the
server as a daemon, which nothing else would stop.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

PG_BIN = os.environ.get("YIELDSTAR_PG_BIN", "/usr/lib/postgresql/15/bin")


def available() -> Optional[str]:
    """None if a cluster can be started here, else why not."""
    if not os.path.isfile(os.path.join(PG_BIN, "initdb")):
        return f"no PostgreSQL server binaries in {PG_BIN} (set YIELDSTAR_PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser, which initdb needs to run as the postgres user"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'yieldstar[postgres]')"
    return None


def _literal_addresses(addresses: Sequence[str]) -> list[str]:
    """`addresses` checked to be literal IP addresses of one interface each (not `*`, not
    `0.0.0.0` or `::`, not a host name that could resolve to anything)."""
    checked = []
    for address in addresses:
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"listen_addresses takes literal IP addresses only, not {address!r}") from None
        if parsed.is_unspecified:
            raise ValueError(f"{address} would listen on every interface: give one interface's address")
        checked.append(str(parsed))
    return checked


class Cluster:
    def __init__(self, *, listen_addresses: Sequence[str] = (), trusted_networks: Sequence[str] = ()) -> None:
        """`listen_addresses`: TCP addresses to listen on (port 5432) besides the Unix socket,
        none by default; `trusted_networks`: the client networks (CIDR) allowed in over TCP
        without a password."""
        self.listen_addresses = _literal_addresses(listen_addresses)
        self.trusted_networks = [str(ipaddress.ip_network(network)) for network in trusted_networks]
        if any(ipaddress.ip_network(network).prefixlen == 0 for network in self.trusted_networks):
            raise ValueError("trusted_networks may not include every address (a /0 network)")
        if self.trusted_networks and not self.listen_addresses:
            raise ValueError("trusted_networks is for a cluster that listens on TCP (listen_addresses)")
        self.folder = tempfile.mkdtemp(prefix="yieldstar-pg-")
        self.data = os.path.join(self.folder, "data")
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.folder, "postgres")
        self.user = "postgres" if self._as_postgres else None
        self._databases = 0
        self._guard: Optional[subprocess.Popen] = None

    def _command(self, program: str) -> list[str]:
        command = [os.path.join(PG_BIN, program)]
        return ["runuser", "-u", "postgres", "--", *command] if self._as_postgres else command

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [*self._command(args[0]), *args[1:]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> "Cluster":
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        if self.trusted_networks:
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as hba:
                hba.write("# the networks of the hosts this cluster was started for\n")
                hba.writelines(f"host all all {network} trust\n" for network in self.trusted_networks)
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start the server (again): on its Unix socket, and on `listen_addresses` only (by
        default none: never on a network address); guarded from its first start until `stop`."""
        if self._guard is None:
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "supervisor.chaos.cluster_guard", self.folder, self.data,
                 *self._command("pg_ctl")],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                cwd="/")  # no folder of the caller's on its path: nothing there may pass for our package
        listen = ",".join(self.listen_addresses)
        options = (f"-c listen_addresses='{listen}' -c unix_socket_directories={self.folder}"
                   " -c unix_socket_permissions=0700 -c max_connections=300 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.folder, "server.log"), "-w",
                  "start")

    def replica(self) -> "Cluster":
        """A streaming replica of this running cluster, not started: a `pg_basebackup` of it
        into a folder of its own, set to follow it (`-R`: standby.signal and primary_conninfo on
        this cluster's socket). Asynchronous, as PostgreSQL's replication is by default.
        `start_server()` starts it as a read-only standby; `promote()` makes it a primary."""
        if self.listen_addresses:
            raise ValueError("a replica is made of a cluster that listens on its Unix socket only")
        replica = Cluster()
        self._run("pg_basebackup", "-D", replica.data, "-h", self.folder, "-U", "postgres", "-R", "-X", "stream",
                  "--no-sync", "-c", "fast", timeout=120)
        return replica

    def promote(self) -> None:
        """End this standby's recovery and make it a primary (on a new timeline), waiting for it."""
        self._run("pg_ctl", "-D", self.data, "-w", "promote")

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data: `start_server()` starts it again."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def uri(self, database: str = "postgres", address: Optional[str] = None) -> str:
        """The URI of `database` on the Unix socket, or over TCP at one of `listen_addresses`."""
        if address is None:
            return f"postgresql://postgres@/{database}?host={self.folder}"
        if address not in self.listen_addresses:
            raise ValueError(f"the cluster does not listen on {address} (it listens on {self.listen_addresses})")
        host = f"[{address}]" if ":" in address else address
        return f"postgresql://postgres@{host}:5432/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URI."""
        import psycopg

        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        with psycopg.connect(self.uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._guard is not None:
            self._guard.communicate(b"done", timeout=30)
            self._guard = None

