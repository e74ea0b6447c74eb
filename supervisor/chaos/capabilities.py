"""Which fault kinds a run can inject, on its ledger and this host.

By backend (`BACKEND_ONLY`): `hold_write_lock` and `disk_full` exist on a SQLite ledger only,
`connection_kill` on PostgreSQL only. By setup (`HOSTS_ONLY`): `partition`, `frozen_host` and
`server_restart` need `--hosts` (network-namespace hosts and the run's own server). `clock_skew`
skews a SQLite ledger's clock, or, with `--hosts`, the wall clock of a host's processes; on a
PostgreSQL ledger without hosts it has nothing to skew. By host: `disk_full` needs root (it mounts
the tmpfs) and the harness's own ledger; `clock_skew` needs a lease with room for a skew and a
runtime whose SQLite ledger clock a skewed environment moves (`fleet.skewed_env`), or a wall-clock shim
that really shifts a process's clock (`wall_clock`, with `--hosts`), each checked in a subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from typing import Optional

from ..ledger.errors import InvalidArgument
from .config import ChaosConfig
from .disk import can_mount
from .faults import ALL_KINDS, FaultKind
from .fleet import ROOT, skewed_env
from .ledger_reads import POSTGRES, SQLITE, backend_kind

CLOCK_PROBE = """
import json, os, sys, time
from supervisor.ledger.backends import open_backend
with open_backend(sys.argv[1]) as backend:
    before = time.time_ns() // 1_000_000
    record = backend.executions.admit("clock-probe", "clock-probe")
print(record.created_at - before)
"""
PROBE_SKEW_MS = 600_000


def clock_skew_honoured(folder: str) -> Optional[str]:
    """None if a process started with `skewed_env` has a ledger clock that adds the skew, else why not."""
    path = os.path.join(folder, "logs", "clock-probe.db")
    env = skewed_env(PROBE_SKEW_MS, dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    try:
        done = subprocess.run([sys.executable, "-c", CLOCK_PROBE, path], capture_output=True, text=True, env=env,
                              timeout=60)
    finally:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    if done.returncode != 0:
        return f"the clock probe failed: {done.stderr.strip()[-300:]}"
    if abs(int(done.stdout.strip()) - PROBE_SKEW_MS) > 30_000:
        return "this runtime's ledger clock ignores a skewed environment (supervisor/chaos/skewed_clock/)"
    return None


WALL_CLOCK_PROBE = "import time; print(time.time_ns() // 1_000_000)"


def wall_clock_shifted(folder: str) -> Optional[str]:
    """None if `wall_clock.shifted_env` really shifts a child's wall clock, else why not."""
    try:
        from .wall_clock import shifted_env
    except ImportError as exc:
        return f"no wall-clock shim (supervisor/chaos/wall_clock.py: {exc})"
    try:
        env = shifted_env(PROBE_SKEW_MS, dict(os.environ))
        before = time.time_ns() // 1_000_000
        done = subprocess.run([sys.executable, "-c", WALL_CLOCK_PROBE], capture_output=True, text=True, env=env,
                              timeout=60)
    except Exception as exc:  # a shim that cannot be built (no compiler) says so in its own words
        return f"the wall-clock shim is not usable here: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return f"the wall-clock probe failed: {done.stderr.strip()[-300:]}"
    if abs(int(done.stdout.strip()) - before - PROBE_SKEW_MS) > 30_000:
        return "the wall-clock shim does not shift a child's clock"
    return None


# The fault kinds that exist on one backend only, and why.
BACKEND_ONLY = {
    FaultKind.HOLD_WRITE_LOCK: (SQLITE, "it takes a SQLite file's write lock (PostgreSQL locks rows, not the database)"),
    FaultKind.DISK_FULL: (SQLITE, "it fills a tmpfs under the ledger's file"),
    FaultKind.CONNECTION_KILL: (POSTGRES, "it terminates the runtime's PostgreSQL sessions"),
}
# The fault kinds of a `--hosts` run only, and why.
HOSTS_ONLY = {
    FaultKind.PARTITION: "it takes down a host's veth to the run's own server",
    FaultKind.FROZEN_HOST: "it freezes every process of a network-namespace host",
    FaultKind.SERVER_RESTART: "it restarts the run's own PostgreSQL server",
}
CLOCK_SKEW_ELSEWHERE = ("PostgreSQL's ledger clock is the server's; with --hosts it skews a host's wall clock"
                        " instead, which must change nothing")
BACKEND_NAMES = {SQLITE: "SQLite", POSTGRES: "PostgreSQL"}


def kinds_not_offered(backend: str, hosts: int = 0) -> dict[str, str]:
    """{kind: why} for the fault kinds that do not exist on `backend` (`sqlite` or `postgres`), with
    or without `hosts`."""
    found = {kind.value: f"{BACKEND_NAMES[only]} only: {why}" for kind, (only, why) in BACKEND_ONLY.items()
             if only != backend}
    if not hosts:
        found.update({kind.value: f"--hosts only: {why}" for kind, why in HOSTS_ONLY.items()})
        if backend == POSTGRES:
            found[FaultKind.CLOCK_SKEW.value] = f"SQLite or --hosts only: {CLOCK_SKEW_ELSEWHERE}"
    return found


def applicable_kinds(config: ChaosConfig, folder: str, db=None) -> tuple[ChaosConfig, dict]:
    """The config with the fault kinds this ledger and host cannot take left out, and why each
    host-dependent one was.

    `db`: the ledger the run was given (a SQLite path or a postgresql:// URI); None for the
    harness's own SQLite file, or, with `config.hosts`, its own PostgreSQL server. Asked for all
    kinds (the default), the kinds of the other backend (or setup) are not offered and a kind this
    host cannot inject is left out (the latter with a reason); named explicitly, either is an
    error."""
    backend = POSTGRES if config.hosts else backend_kind(db) if db is not None else SQLITE
    explicit = tuple(config.faults) != ALL_KINDS
    elsewhere = kinds_not_offered(backend, config.hosts)
    named_elsewhere = [k.value for k in config.faults if k.value in elsewhere]
    if named_elsewhere and explicit:
        setup = f"a {BACKEND_NAMES[backend]} ledger" + (" with --hosts" if config.hosts else "")
        raise InvalidArgument("; ".join(f"{kind} does not run on {setup} ({elsewhere[kind]})"
                                        for kind in named_elsewhere))
    config = dataclasses.replace(config, faults=tuple(k for k in config.faults if k.value not in elsewhere))
    why_not: dict[str, str] = {}
    if FaultKind.DISK_FULL in config.faults:
        reason = can_mount() or ("it needs the ledger on the harness's own tmpfs; leave out --db" if db else None)
        if reason:
            why_not[FaultKind.DISK_FULL.value] = reason
    if FaultKind.CLOCK_SKEW in config.faults and config.hosts:
        reason = wall_clock_shifted(folder)
        if reason:
            why_not[FaultKind.CLOCK_SKEW.value] = reason
    elif FaultKind.CLOCK_SKEW in config.faults:
        if config.max_skew_ms < 10:
            why_not[FaultKind.CLOCK_SKEW.value] = (f"a lease of {config.lease_ms} ms renewed every {config.renew_ms} ms"
                                                   " leaves no room for a clock skew")
        else:
            reason = clock_skew_honoured(folder)
            if reason:
                why_not[FaultKind.CLOCK_SKEW.value] = reason
    if why_not and explicit:
        raise InvalidArgument("; ".join(f"{kind} cannot be injected here: {why}" for kind, why in why_not.items()))
    kinds = tuple(k for k in config.faults if k.value not in why_not)
    return dataclasses.replace(config, faults=kinds), why_not
