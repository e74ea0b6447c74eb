"""The progress line of a chaos run."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Callable

from .faults import FaultKind


class Progress:
    """The progress line: carriage-return updated on a terminal, a line every few seconds otherwise."""

    def __init__(self, out: Callable[[str], None], tty: bool):
        self.out = out
        self.tty = tty
        self.every = 1.0 if tty else 5.0
        self._next = 0.0
        self._width = 0
        self._explained = False

    def show(self, line: str, *, force: bool = False) -> None:
        if not self._explained:  # once, before the first progress line: what its short names mean
            self._explained = True
            self.out(legend())
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every
        if self.tty:
            line = line[: shutil.get_terminal_size().columns - 1]  # a wrapped line cannot be redrawn
            sys.stdout.write("\r" + line.ljust(self._width))
            sys.stdout.flush()
            self._width = len(line)
        else:
            self.out(line)

    def done(self) -> None:
        if self.tty and self._width:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._width = 0


# Fault kinds in the progress line, which must fit a terminal's width.
SHORT = {FaultKind.KILL_CHILD: "kc", FaultKind.FREEZE_CHILD: "sc", FaultKind.KILL_SUPERVISOR: "ks",
         FaultKind.FREEZE_SUPERVISOR: "ss", FaultKind.TERM_SUPERVISOR: "ts", FaultKind.HOLD_WRITE_LOCK: "lk",
         FaultKind.DISK_FULL: "df", FaultKind.SLOW_START: "sl", FaultKind.CLOCK_SKEW: "ck",
         FaultKind.CONNECTION_KILL: "cx", FaultKind.PARTITION: "pt", FaultKind.FROZEN_HOST: "fh",
         FaultKind.SERVER_RESTART: "sr"}


def legend() -> str:
    """The progress line's abbreviations, spelled out (printed once, before the first line)."""
    kinds = ", ".join(f"{short} {kind.value}" for kind, short in SHORT.items())
    return (f"progress: [phase elapsed] admitted by the harness/planned +started by workflows, completed and"
            f" failed executions | faults injected by kind: {kinds} | supervisors running (frozen, cut off)")
