"""Reading a chaos run's evidence outside the ledger: the step log, the external system's log,
the sender's message log, the supervisors' logs, the fault journal, the fleet journal and the
lock holders' log (formats in `worker.apps.chaos`, `sender.py`, `faults.py` and `fleet.py`)."""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from worker.apps.chaos import EXTERNAL, STEP_LOG

from ..loop import ENDED_IN_LEDGER, LOST_LINE, RELEASE_LINE, RENEWAL_FOUND_LOST, STOP_LINE
from .sender import MESSAGE_LOG


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


@dataclass(frozen=True)
class SendLine:
    """One attempt of the harness's sender (`sender`): sent, error (retried) or refused."""

    outcome: str
    execution_id: str
    topic: str
    message_id: str
    repeat: bool
    time_ns: int
    detail: str


def read_sends(folder: str) -> Optional[list[SendLine]]:
    """The sender's log, in the order it was written; None if the run kept none."""
    path = os.path.join(folder, MESSAGE_LOG)
    if not os.path.exists(path):
        return None
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            fields = line.split()
            if line.endswith("\n") and len(fields) >= 6:
                found.append(SendLine(fields[0], fields[1], fields[2], fields[3], fields[4] == "1", int(fields[5]),
                                      fields[6] if len(fields) > 6 else ""))
    return found


def read_external(folder: str) -> tuple[dict, Counter, dict]:
    """The external system's log: {effect id: [(receipt, pid, token), ...]}, repeats per id, and
    {effect id: {(execution, step key), ...}}: who asked for it (executed or repeated)."""
    executed: dict[str, list] = defaultdict(list)
    repeats: Counter = Counter()
    askers: dict[str, set] = defaultdict(set)
    for path in sorted(glob.glob(os.path.join(folder, EXTERNAL, "*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split()
                if not line.endswith("\n") or not fields:
                    continue
                if fields[0] == "execute":
                    executed[fields[1]].append((fields[2], int(fields[3]), int(fields[4])))
                    asker = fields[6:8]
                elif fields[0] == "repeat":
                    repeats[fields[1]] += 1
                    asker = fields[5:7]
                else:
                    continue
                if len(asker) == 2:
                    askers[fields[1]].add(tuple(asker))
    return executed, repeats, askers


REFUSALS = [
    # what the log line says, how to find the execution and token in it
    ("worker_writes", re.compile(r"execution (\S+) token (\d+): write of .* refused")),
    ("renewals", re.compile(r"execution (\S+) token (\d+): " + re.escape(RENEWAL_FOUND_LOST) + ";")),
    # not a refusal: the heartbeat's check found the delivery ended before a renewal was refused
    ("ended_in_ledger", re.compile(r"execution (\S+) token (\d+): " + re.escape(ENDED_IN_LEDGER) + ";")),
    ("deliveries_lost", re.compile(r"delivery execution=(\S+) token=(\d+) outcome=lost")),
]


def _supervisor_log_lines(folder: str) -> Iterator[tuple[int, str]]:
    """(supervisor number, line) of every supervisor's log, its workers' lines included."""
    for path in sorted(glob.glob(os.path.join(folder, "logs", "supervisor-*.log"))):
        number = int(re.search(r"supervisor-(\d+)\.log$", path).group(1))
        with open(path, errors="replace") as f:
            for line in f:
                yield number, line


def read_refusals(folder: str) -> tuple[list[tuple[str, str, int, int]], int]:
    """Stale operations the runtime refused, as the supervisors and their workers logged them:
    `(kind, execution, token, supervisor number)` for worker writes the fence refused, renewals
    that found the lease lost, deliveries the heartbeat's check found ended in the ledger (a
    renewal would have been refused next), and deliveries that ended lost; and how many tracebacks the logs
    hold."""
    found = []
    tracebacks = 0
    for number, line in _supervisor_log_lines(folder):
        if line.startswith("Traceback"):
            tracebacks += 1
            continue
        for kind, pattern in REFUSALS:
            match = pattern.search(line)
            if match:
                found.append((kind, match.group(1), int(match.group(2)), number))
    return found, tracebacks


# A delivery's worker and its supervisor lost each other, and the lease was left to expire: the
# supervisor found the worker silent (and killed it), or the worker left for want of heartbeats.
HEARTBEAT_LOSS = re.compile(r"execution (\S+) token (\d+): worker pid \d+ (?:silent for|lost its supervisor)")


def read_heartbeat_losses(folder: str) -> set[tuple[str, int]]:
    """`(execution, token)` of each delivery whose worker and supervisor lost each other's
    heartbeats, as the supervisors logged it."""
    return {(match.group(1), int(match.group(2))) for _, line in _supervisor_log_lines(folder)
            if (match := HEARTBEAT_LOSS.search(line))}


def _line_pattern(template: str) -> re.Pattern:
    """A regular expression for the log lines a printf-style `template` of the loop makes: each
    `%s` a lazy group, each `%d` a group of digits."""
    parts = re.split(r"(%[sd])", template)
    return re.compile("".join({"%s": r"(.*?)", "%d": r"(\d+)"}.get(p, re.escape(p)) for p in parts) + "$")


STOPPED = _line_pattern(STOP_LINE)  # execution, token, why, worker pid
KILLED_FOR = _line_pattern(LOST_LINE)  # the same, one delivery per worker: its worker killed
RELEASED = _line_pattern(RELEASE_LINE)  # execution, token, why (which names the worker)
WORKER_IN_WHY = re.compile(r"worker pid (\d+)")
# Why a worker of several deliveries was replaced, as `replace_and_release` words it.
REPLACED_BECAUSE = (("did not stop", "sibling_unstoppable"), ("silent for", "silent"), ("was gone", "gone"),
                    ("mid-delivery", "exited"))


@dataclass
class WorkerEnds:
    """What the supervisors logged about the deliveries of their workers (`supervisor.loop`):
    which worker ran each delivery, the deliveries stopped one at a time (`Stop`, with
    `--workers`), and those released because their worker was replaced (killed, found dead or
    silent, or replaced for a delivery of it that would not stop)."""

    workers: dict  # (execution, token) -> {worker pid}: the workers a supervisor named for it
    released: dict  # (execution, token) -> (supervisor number, worker pid, why: a REPLACED_BECAUSE reason)
    stopped: Counter  # deliveries told to stop one at a time, by why: lease_lost | unconfirmed | other

    def figures(self) -> dict:
        return {"stopped_one_at_a_time": dict(sorted(self.stopped.items())),
                "released_with_their_worker": dict(sorted(Counter(r[2] for r in self.released.values()).items()))}


def read_worker_ends(folder: str) -> WorkerEnds:
    return worker_ends(_supervisor_log_lines(folder))


def worker_ends(lines: Iterable[tuple[int, str]]) -> WorkerEnds:
    """The `WorkerEnds` of `(supervisor number, line)` pairs of supervisors' logs."""
    ends = WorkerEnds(defaultdict(set), {}, Counter())
    for number, line in lines:
        line = line.rstrip("\n")
        if (match := STOPPED.search(line)) or (match := KILLED_FOR.search(line)):
            eid, token, why, pid = match.groups()
            ends.workers[(eid, int(token))].add(int(pid))
            if match.re is STOPPED:
                ends.stopped["lease_lost" if why == RENEWAL_FOUND_LOST
                             else "unconfirmed" if why.startswith("no renewal has confirmed") else "other"] += 1
        elif (match := RELEASED.search(line)) and (worker := WORKER_IN_WHY.search(match.group(3))):
            key, pid = (match.group(1), int(match.group(2))), int(worker.group(1))
            ends.workers[key].add(pid)
            why = next((reason for words, reason in REPLACED_BECAUSE if words in match.group(3)), "other")
            ends.released[key] = (number, pid, why)
    ends.workers = dict(ends.workers)
    return ends


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip() and line.endswith("\n")]


def read_fault_journal(folder: str) -> list[dict]:
    """Every injected fault, as `faults.Fault.as_dict()` wrote it."""
    return _jsonl(os.path.join(folder, "faults.jsonl"))


def read_faults(folder: str) -> dict:
    by_kind: Counter = Counter()
    in_step = 0
    for fault in read_fault_journal(folder):
        by_kind[fault["kind"]] += 1
        in_step += bool(fault.get("step"))
    return {"total": sum(by_kind.values()), "inside_a_step": in_step, "by_kind": dict(sorted(by_kind.items()))}


@dataclass
class SupervisorLife:
    """One supervisor of the fleet, from the fleet journal: when it lived and with what clock."""

    number: int
    pid: int
    started_ms: int
    skew_ms: int = 0
    import_delay_ms: int = 0
    lenient: bool = False
    host: Optional[int] = None  # the host it ran in (`--hosts`)
    wall_skew_ms: int = 0  # how far its host's wall clock ran ahead (`--hosts`); its ledger clock is the server's
    ended_ms: Optional[int] = None
    how: Optional[str] = None  # killed | stopped | crashed | killed at the end


def read_fleet(folder: str) -> Optional[dict[int, list[SupervisorLife]]]:
    """{pid: [its lives, oldest first]} from `supervisors.jsonl`, or None if there is none."""
    path = os.path.join(folder, "supervisors.jsonl")
    if not os.path.exists(path):
        return None
    by_number: dict[int, SupervisorLife] = {}
    for event in _jsonl(path):
        if event["event"] == "start":
            by_number[event["number"]] = SupervisorLife(
                event["number"], event["pid"], event["at_ms"], event.get("skew_ms", 0),
                event.get("import_delay_ms", 0), event.get("lenient", False), event.get("host"),
                event.get("wall_skew_ms", 0))
        elif event["event"] == "exit" and event["number"] in by_number:
            life = by_number[event["number"]]
            life.ended_ms, life.how = event["at_ms"], event.get("how")
    lives: dict[int, list[SupervisorLife]] = defaultdict(list)
    for life in sorted(by_number.values(), key=lambda l: l.started_ms):
        lives[life.pid].append(life)
    return dict(lives)


def read_lock_holds(folder: str) -> dict[int, tuple[int, Optional[int]]]:
    """{lock holder pid: (held_ms, released_ms or None)}: when each really held the write lock."""
    holds: dict[int, list] = {}
    path = os.path.join(folder, "logs", "lock-holders.log")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) == 3 and line.endswith("\n") and fields[0] in ("held", "released"):
                    pid, ms = int(fields[1]), int(fields[2]) // 1_000_000
                    if fields[0] == "held":
                        holds[pid] = [ms, None]
                    elif pid in holds:
                        holds[pid][1] = ms
    return {pid: (held, released) for pid, (held, released) in holds.items()}


def read_run_config(folder: str) -> Optional[dict]:
    """The chaos run's configuration (`config.json`), if the folder has one."""
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
