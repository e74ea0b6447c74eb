"""Reading a chaos run's evidence outside the ledger: the step log, the external system's log,
the supervisors' logs and the fault journal (formats in `worker.chaos_app` and `faults.py`)."""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterator

from worker.chaos_app import EXTERNAL, STEP_LOG


@dataclass(frozen=True)
class LogLine:
    event: str
    execution_id: str
    token: int
    pid: int
    key: str
    time_ns: int
    extra: str


def read_step_log(folder: str) -> Iterator[LogLine]:
    path = os.path.join(folder, STEP_LOG)
    if not os.path.exists(path):
        return
    with open(path, errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                continue  # a line cut short by a kill is not evidence of anything
            fields = line.split()
            if len(fields) < 6:
                continue
            yield LogLine(fields[0], fields[1], int(fields[2]), int(fields[3]), fields[4], int(fields[5]),
                          fields[6] if len(fields) > 6 else "")


def read_external(folder: str) -> tuple[dict, Counter]:
    """The external system's log: {effect id: [(receipt, pid, token), ...]} and repeats per id."""
    executed: dict[str, list] = defaultdict(list)
    repeats: Counter = Counter()
    for path in sorted(glob.glob(os.path.join(folder, EXTERNAL, "*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split()
                if not line.endswith("\n") or not fields:
                    continue
                if fields[0] == "execute":
                    executed[fields[1]].append((fields[2], int(fields[3]), int(fields[4])))
                elif fields[0] == "repeat":
                    repeats[fields[1]] += 1
    return executed, repeats


REFUSALS = [
    # what the log line says, how to find the execution and token in it
    ("worker_writes", re.compile(r"execution (\S+) token (\d+): write of .* refused")),
    ("renewals", re.compile(r"execution (\S+) token (\d+): renewal found the lease lost")),
    ("deliveries_lost", re.compile(r"delivery execution=(\S+) token=(\d+) outcome=lost")),
]


def read_refusals(folder: str) -> tuple[list[tuple[str, str, int]], int]:
    """Stale operations the runtime refused, as the supervisors and their workers logged them:
    `(kind, execution, token)` for worker writes the fence refused, renewals that found the lease
    lost, and deliveries that ended lost; and how many tracebacks the logs hold."""
    found = []
    tracebacks = 0
    for path in sorted(glob.glob(os.path.join(folder, "logs", "supervisor-*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("Traceback"):
                    tracebacks += 1
                    continue
                for kind, pattern in REFUSALS:
                    match = pattern.search(line)
                    if match:
                        found.append((kind, match.group(1), int(match.group(2))))
    return found, tracebacks


def read_faults(folder: str) -> dict:
    by_kind: Counter = Counter()
    in_step = 0
    path = os.path.join(folder, "faults.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    fault = json.loads(line)
                    by_kind[fault["kind"]] += 1
                    in_step += bool(fault.get("step"))
    return {"total": sum(by_kind.values()), "inside_a_step": in_step, "by_kind": dict(sorted(by_kind.items()))}
