"""What the harness sees of the processes it attacks, from the logs they append to: which worker
is inside a step right now (`steps.log`), and which is still importing the app (`imports.log`,
written by `worker.apps.chaos` when its import is slowed down)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

import psutil


class LogTail:
    """The complete lines appended to a file since the last poll."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self) -> list[list[str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [raw.decode(errors="replace").split() for raw in lines]


def _own_line(process: psutil.Process, line_ns: int) -> bool:
    """The line was written by this process, not by an earlier holder of its pid."""
    try:
        return process.create_time() * 1e9 <= line_ns + 1e7
    except psutil.Error:
        return False


@dataclass
class OpenStep:
    execution_id: str
    token: int
    key: str
    pid: int
    begun_ns: int

    def as_dict(self) -> dict:
        return {"execution_id": self.execution_id, "token": self.token, "key": self.key, "pid": self.pid}


class StepWatcher:
    """Tails the step log: a `begin` line opens a step for its pid and delivery, any later line of
    that pid and delivery closes it. (A worker of several deliveries, `--workers`, is inside the
    steps of several at once.)"""

    def __init__(self, path: str):
        self._tail = LogTail(path)
        self.open: dict[int, dict[tuple[str, int], OpenStep]] = {}  # pid -> (execution, token) -> its step

    def poll(self) -> None:
        for fields in self._tail.lines():
            if len(fields) < 6:
                continue
            pid, delivery = int(fields[3]), (fields[1], int(fields[2]))
            if fields[0] == "begin":
                self.open.setdefault(pid, {})[delivery] = OpenStep(fields[1], int(fields[2]), fields[4], pid,
                                                                   int(fields[5]))
            elif pid in self.open:
                self.open[pid].pop(delivery, None)

    def inside_all(self, process: psutil.Process, skew_ms: int = 0) -> list[OpenStep]:
        """The steps `process` is in now, the latest first: those whose begin line is its own and
        recent. `skew_ms`: how far the process's wall clock, which wrote the lines' times, runs
        ahead (a host's, `--hosts`)."""
        found = []
        for step in self.open.get(process.pid, {}).values():
            begun_ns = step.begun_ns - skew_ms * 1_000_000
            if time.time_ns() - begun_ns <= 30e9 and _own_line(process, begun_ns):
                found.append(step)
        return sorted(found, key=lambda s: s.begun_ns, reverse=True)

    def inside(self, process: psutil.Process, skew_ms: int = 0) -> Optional[OpenStep]:
        """The step `process` began last among those it is in now (see `inside_all`)."""
        steps = self.inside_all(process, skew_ms)
        return steps[0] if steps else None


IMPORT_LOG = os.path.join("logs", "imports.log")  # in the work folder


class ImportWatcher:
    """Tails the import log of slow-started workers: `importing <pid> <time_ns>` when a worker
    begins to import the app, `imported <pid> <time_ns>` once it has."""

    def __init__(self, path: str):
        self._tail = LogTail(path)
        self._importing: dict[int, int] = {}  # pid -> when it began, while it imports

    def poll(self) -> None:
        for fields in self._tail.lines():
            if len(fields) != 3:
                continue
            pid = int(fields[1])
            if fields[0] == "importing":
                self._importing[pid] = int(fields[2])
            else:
                self._importing.pop(pid, None)

    def importing_since(self, process: psutil.Process) -> Optional[int]:
        """When `process` began to import the app (time_ns), if it is importing it now."""
        began = self._importing.get(process.pid)
        if began is None or not _own_line(process, began):
            return None
        return began
