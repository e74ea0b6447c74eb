"""Which fault kinds a run can inject, on its ledger and this host.

By backend (`BACKEND_ONLY`): `hold_write_lock`, `disk_full` and `clock_skew` exist on a SQLite
ledger only, `connection_kill` on PostgreSQL only. By host: `disk_full` needs root (it mounts the
tmpfs) and the harness's own ledger; `clock_skew` needs a lease with room for a skew, and a
runtime whose ledger clock honours `YIELDSTAR_CHAOS_CLOCK_SKEW_MS` (checked in a subprocess,
through the backend's own default clock)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Optional

from ..ledger.errors import InvalidArgument
from .config import ChaosConfig
from .disk import can_mount
from .faults import ALL_KINDS, FaultKind
from .fleet import CLOCK_SKEW_ENV, ROOT
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
    """None if this runtime's ledger clock adds `YIELDSTAR_CHAOS_CLOCK_SKEW_MS`, else why not."""
    path = os.path.join(folder, "logs", "clock-probe.db")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env[CLOCK_SKEW_ENV] = str(PROBE_SKEW_MS)
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
        return f"this runtime's ledger clock ignores {CLOCK_SKEW_ENV}"
    return None


# The fault kinds that exist on one backend only, and why.
BACKEND_ONLY = {
    FaultKind.HOLD_WRITE_LOCK: (SQLITE, "it takes a SQLite file's write lock (PostgreSQL locks rows, not the database)"),
    FaultKind.DISK_FULL: (SQLITE, "it fills a tmpfs under the ledger's file"),
    FaultKind.CLOCK_SKEW: (SQLITE, "it skews a SQLite ledger's clock (PostgreSQL's ledger clock is the server's)"),
    FaultKind.CONNECTION_KILL: (POSTGRES, "it terminates the runtime's PostgreSQL sessions"),
}
BACKEND_NAMES = {SQLITE: "SQLite", POSTGRES: "PostgreSQL"}


def kinds_not_offered(backend: str) -> dict[str, str]:
    """{kind: why} for the fault kinds that do not exist on `backend` (`sqlite` or `postgres`)."""
    return {kind.value: f"{BACKEND_NAMES[only]} only: {why}" for kind, (only, why) in BACKEND_ONLY.items()
            if only != backend}


def applicable_kinds(config: ChaosConfig, folder: str, db=None) -> tuple[ChaosConfig, dict]:
    """The config with the fault kinds this ledger and host cannot take left out, and why each
    host-dependent one was.

    `db`: the ledger the run was given (a SQLite path or a postgresql:// URI); None for the
    harness's own SQLite file. Asked for all kinds (the default), the kinds of the other backend
    are not offered and a kind this host cannot inject is left out (the latter with a reason);
    named explicitly, either is an error."""
    backend = backend_kind(db) if db is not None else SQLITE
    explicit = tuple(config.faults) != ALL_KINDS
    elsewhere = kinds_not_offered(backend)
    named_elsewhere = [k.value for k in config.faults if k.value in elsewhere]
    if named_elsewhere and explicit:
        raise InvalidArgument("; ".join(f"{kind} does not run on a {BACKEND_NAMES[backend]} ledger"
                                        f" ({elsewhere[kind]})" for kind in named_elsewhere))
    config = dataclasses.replace(config, faults=tuple(k for k in config.faults if k.value not in elsewhere))
    why_not: dict[str, str] = {}
    if FaultKind.DISK_FULL in config.faults:
        reason = can_mount() or ("it needs the ledger on the harness's own tmpfs; leave out --db" if db else None)
        if reason:
            why_not[FaultKind.DISK_FULL.value] = reason
    if FaultKind.CLOCK_SKEW in config.faults:
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
