"""Which fault kinds this host can inject: `disk_full` needs root (it mounts the tmpfs) and the
harness's own ledger; `clock_skew` needs a lease with room for a skew, and a runtime whose ledger
clock honours `YIELDSTAR_CHAOS_CLOCK_SKEW_MS` (checked in a subprocess, through the backend's own
default clock)."""

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


def applicable_kinds(config: ChaosConfig, folder: str, db_given: bool) -> tuple[ChaosConfig, dict]:
    """The config with the fault kinds this host cannot inject left out, and why each was.

    Asked for all kinds (the default), a kind that cannot be injected is left out; named
    explicitly, it is an error."""
    explicit = tuple(config.faults) != ALL_KINDS
    why_not: dict[str, str] = {}
    if FaultKind.DISK_FULL in config.faults:
        reason = can_mount() or ("it needs the ledger on the harness's own tmpfs; leave out --db" if db_given else None)
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
