"""Several hosts on one machine: Linux network namespaces joined to one PostgreSQL server by veth
pairs, for the multi-host tests (and `yieldstar chaos --hosts N`).

    root namespace (the database side)                 namespace ys-PID-S-h0 (host 0)
    PostgreSQL on 10.231.B.1 ---- veth ysPIDsSd0 ====== ysPIDsSh0 10.231.B.2
               and 10.231.B.5 --- veth ysPIDsSd1 ====== ysPIDsSh1 10.231.B.6  (host 1) ...

Each host gets a /30 of one /24 block of 10.231.0.0/16 that no address or route on this machine
overlaps (looked up with `ip`, under a lock file, so that two runs never pick the same block).
The server listens on the database side's addresses and no other (never a wildcard, never a
real interface); its Unix socket stays, for the test's own connections. A host's namespace has
its loopback and its end of the veth and no other route: a process in it can reach the database
and nothing else. `Host.command(argv)` runs `argv` inside the namespace (`ip netns exec`, which
execs in place: the process started is `argv` itself, in the caller's PID namespace).

A partition is `Host.partition()`: the database's end of the host's veth goes down (the host's
end loses its carrier; TCP segments are dropped, nothing is reset), and `Host.heal()` brings it
back. Nothing else is needed: no firewall.

`Hosts.stop()` (or leaving the `with` block) kills every process still inside the namespaces,
stops the server, deletes the veths and the namespaces, and checks that they are gone. What a
run killed before its teardown left behind is removed by the next run: namespaces and links
named after a process that no longer exists, and the server it had started (each run records
its server's folder in RUNS, named after its process, until its teardown).

Root is needed, and the `ip` command (iproute2); `available()` says why not otherwise.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from . import cluster as clusters

SPACE = ipaddress.ip_network("10.231.0.0/16")  # the blocks (/24) hosts' networks are picked from
MAX_HOSTS = 64  # /30 networks in one /24
LOCK_FILE = "/run/lock/yieldstar-hosts.lock"
RUNS = "/run/yieldstar-hosts"  # one file per live run: its server's folder
LINK_TIMEOUT_S = 5.0
_STALE_NAMESPACE = re.compile(r"^ys-(\d+)-\d+-h\d+$")
_STALE_LINK = re.compile(r"^ys([0-9a-f]+)s\d+[dh]\d+$")
_serials = itertools.count()


def available() -> Optional[str]:
    """None if hosts can be started here, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating network namespaces and veth pairs needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return clusters.available()


def ip(*args: str, timeout: float = 30) -> str:
    """One `ip` command; its output, or a RuntimeError with what it said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _ip_json(*args: str) -> list[dict]:
    return json.loads(ip("-j", *args) or "[]")


@dataclass
class Host:
    """One host: a network namespace and its veth pair to the database side."""

    index: int
    namespace: str
    db_link: str  # the database's end, in the root namespace
    host_link: str  # the host's end, in `namespace`
    db_address: str
    host_address: str
    network: str  # the pair's /30
    _cluster: Any = None

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)

    def uri(self, database: str = "postgres") -> str:
        """The URI this host reaches `database` by: the server's address on its veth. `database`
        is a name, or a URI of the same server (as `Cluster.new_database()` returns)."""
        if "://" in database:
            database = database.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
        return self._cluster.uri(database, address=self.db_address)

    def pids(self) -> list[int]:
        """The processes inside this host's namespace."""
        return [int(pid) for pid in ip("netns", "pids", self.namespace).split()]

    def partition(self) -> None:
        """Cut this host off the database: its veth's database end goes down. Returns once the
        host's end has lost its carrier."""
        ip("link", "set", self.db_link, "down")
        self._wait_carrier(False)

    def heal(self) -> None:
        """Join the host to the database again; returns once both ends are up."""
        ip("link", "set", self.db_link, "up")
        self._wait_carrier(True)

    def carrier(self) -> bool:
        """Whether the host's end of the veth has a link to the database's."""
        (link,) = _ip_json("-n", self.namespace, "link", "show", "dev", self.host_link)
        return "LOWER_UP" in link["flags"] and link["operstate"] == "UP"

    def _wait_carrier(self, up: bool) -> None:
        deadline = time.monotonic() + LINK_TIMEOUT_S
        while self.carrier() != up:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the veth of host {self.index} did not go {'up' if up else 'down'}"
                                   f" within {LINK_TIMEOUT_S} s")
            time.sleep(0.01)


class Hosts:
    """`count` hosts and the PostgreSQL server they share; a context manager.

        with Hosts(2) as hosts:
            uri = hosts.cluster.new_database()      # the test's own: the Unix socket
            a, b = hosts
            a.popen([sys.executable, "-m", "supervisor.cli", "--db", a.uri(uri), "supervise", APP])
            a.partition(); ...; a.heal()
    """

    def __init__(self, count: int) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"between 1 and {MAX_HOSTS} hosts, not {count}")
        self.count = count
        self.hosts: list[Host] = []
        self.cluster: Optional[clusters.Cluster] = None
        self.block: Optional[ipaddress.IPv4Network] = None
        self._serial = next(_serials)
        self._record = os.path.join(RUNS, f"{os.getpid()}-{self._serial}")

    def __iter__(self):
        return iter(self.hosts)

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __enter__(self) -> "Hosts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Hosts":
        """Make the namespaces and veths, then start the server on the database side's addresses.
        On any failure, whatever was made is torn down again before the error propagates."""
        try:
            with _lock():
                _remove_stale()
                self.block = _free_block()
                for index in range(self.count):
                    self._add_host(index)
                self.cluster = clusters.Cluster(listen_addresses=[h.db_address for h in self.hosts],
                                                trusted_networks=[h.network for h in self.hosts])
                os.makedirs(RUNS, mode=0o700, exist_ok=True)
                with open(self._record, "w") as record:
                    record.write(self.cluster.folder)
            for host in self.hosts:
                host._cluster = self.cluster
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_host(self, index: int) -> None:
        network = list(self.block.subnets(new_prefix=30))[index]
        db_address, host_address = (str(a) for a in list(network.hosts()))
        pid, serial = os.getpid(), self._serial  # names as _STALE_NAMESPACE and _STALE_LINK read them
        host = Host(index, f"ys-{pid}-{serial}-h{index}", f"ys{pid:x}s{serial}d{index}", f"ys{pid:x}s{serial}h{index}",
                    db_address, host_address, str(network))
        ip("netns", "add", host.namespace)
        self.hosts.append(host)  # from here on, stop() removes it
        ip("link", "add", host.db_link, "type", "veth", "peer", "name", host.host_link, "netns", host.namespace)
        ip("addr", "add", f"{db_address}/30", "dev", host.db_link)
        ip("link", "set", host.db_link, "up")
        ip("-n", host.namespace, "addr", "add", f"{host_address}/30", "dev", host.host_link)
        ip("-n", host.namespace, "link", "set", host.host_link, "up")
        ip("-n", host.namespace, "link", "set", "lo", "up")
        host._wait_carrier(True)

    def stop(self) -> None:
        """Kill what runs in the namespaces, stop the server, delete the veths and namespaces;
        raise if any of them is still there afterwards."""
        for host in self.hosts:
            _kill_inside(host.namespace)
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if os.path.exists(self._record):
            os.unlink(self._record)
        for host in self.hosts:
            _delete(host.namespace, [host.db_link])
        left = [h for h in self.hosts if _link_exists(h.db_link) or h.namespace in _namespaces()]
        self.hosts = []
        if left:
            raise RuntimeError(f"could not remove the namespaces or veths of hosts {[h.index for h in left]}")


# -- the machine's state --------------------------------------------------------------------------

class _lock:
    """An exclusive lock on LOCK_FILE, so that two runs on one machine pick different blocks."""

    def __enter__(self):
        os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
        self._fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)  # releases the lock


def _free_block() -> ipaddress.IPv4Network:
    """The first /24 of SPACE that no address or route of this machine's root namespace overlaps."""
    used = [ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
            for link in _ip_json("-4", "addr", "show") for a in link.get("addr_info", [])]
    used += [ipaddress.ip_network(route["dst"], strict=False)
             for route in _ip_json("-4", "route", "show", "table", "all")
             if route.get("dst") not in (None, "default") and "/0" not in route["dst"]]
    for block in SPACE.subnets(new_prefix=24):
        if not any(block.overlaps(network) for network in used):
            return block
    raise RuntimeError(f"every /24 of {SPACE} is in use on this machine")


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process inside `namespace` and wait for them to be gone."""
    if namespace not in _namespaces():
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(pid) for pid in ip("netns", "pids", namespace).split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete(namespace: str, links: Sequence[str]) -> None:
    """Delete `links` (a veth goes with its peer) and `namespace`, and wait for them to be gone."""
    for link in links:
        if _link_exists(link):
            subprocess.run(["ip", "link", "del", link], capture_output=True, stdin=subprocess.DEVNULL)
    if namespace in _namespaces():
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + LINK_TIMEOUT_S
    while any(_link_exists(link) for link in links) and time.monotonic() < deadline:
        time.sleep(0.02)


def _dead(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _remove_stale() -> None:
    """Remove what runs whose process is gone (killed before their teardown) left: their
    servers, namespaces and links."""
    for run in os.listdir(RUNS) if os.path.isdir(RUNS) else []:
        if _dead(int(run.split("-")[0])):
            with open(os.path.join(RUNS, run)) as record:
                _stop_server(record.read().strip())
            os.unlink(os.path.join(RUNS, run))
    for namespace in _namespaces():
        found = _STALE_NAMESPACE.match(namespace)
        if found and _dead(int(found.group(1))):
            _kill_inside(namespace)
            _delete(namespace, [])
    for link in os.listdir("/sys/class/net"):
        found = _STALE_LINK.match(link)
        if found and _dead(int(found.group(1), 16)):
            _delete("", [link])


def _stop_server(folder: str) -> None:
    """Stop the server of a `Cluster` whose owner is gone (SIGQUIT: an immediate shutdown, as
    `pg_ctl -m immediate`), and remove its folder."""
    if not os.path.basename(folder).startswith("yieldstar-pg-"):
        return  # not a folder `Cluster` made
    data = os.path.join(folder, "data")
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            pid = int(f.readline())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except (OSError, ValueError):
        pid, command = None, []
    if pid is not None and data.encode() in command:  # that server, not a process that took its pid
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
