"""`yieldstar top`: a live terminal view of a ledger that other processes are writing.

Each refresh is one read (`executions.stats()`, a single read transaction), so the view never
holds a lock between refreshes and never writes. A read that finds the database busy skips that
refresh and says so; the last good reading stays on screen. Deliveries per second come from two
readings: the change in `stats.deliveries` (every claim ever made) over the change in `stats.now`.

On a terminal the screen is redrawn every `interval` seconds (rich's alternate screen, restored
on exit); the keyboard is read in cbreak mode (one key at a time, no echo; Ctrl-C still
interrupts), restored on exit too. `q` quits, as do Ctrl-C, SIGTERM and SIGHUP, all with exit 0.
When stdout is not a terminal (a pipe, a file, a test), `top` prints one snapshot as plain text
and returns: a refreshing screen means nothing there.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .ledger.errors import StorageBusy
from .humane import QUEUE_HEADINGS, format_duration, format_time, queue_cells
from .ledger.values import LedgerStats

QUIT_KEYS = ("q", "Q")


def deliveries_per_second(stats: LedgerStats, previous: LedgerStats | None) -> float | None:
    """Claims per second between two readings, or None without an earlier, older one."""
    if previous is None or stats.now <= previous.now:
        return None
    return max(stats.deliveries - previous.deliveries, 0) * 1000 / (stats.now - previous.now)


def render(stats: LedgerStats, previous: LedgerStats | None = None, *, title: str = "",
           note: str = "", live: bool = False) -> Group:
    """One screen: a heading, counts by status, then the live leases and the failing executions."""
    rate = deliveries_per_second(stats, previous)
    heading = Text.assemble(("yieldstar top", "bold"), f"  {title}  " if title else "  ",
                            format_time(stats.now), "   q quits" if live else "")
    counts = Table(box=None, pad_edge=False, show_edge=False)
    for status in stats.by_status:
        counts.add_column(status.upper(), justify="right")
    counts.add_column("DELIVERIES/S", justify="right")
    counts.add_column("DELIVERIES", justify="right")
    counts.add_column("LIVE LEASES", justify="right")
    counts.add_row(*(str(n) for n in stats.by_status.values()), "-" if rate is None else f"{rate:.1f}",
                   str(stats.deliveries), str(len(stats.live_leases)))

    oldest = stats.oldest_due
    due = Text(f"oldest due: {oldest.execution_id} ({oldest.workflow}), waiting "
               f"{format_duration(max(stats.now - oldest.due_at, 0))}" if oldest is not None else "nothing is due")

    leases = Table(box=None, pad_edge=False)
    for name, justify in (("EXECUTION", "left"), ("WORKFLOW", "left"), ("TOKEN", "right"), ("HOLDER", "left"),
                          ("EXPIRES IN", "right"), ("RENEWALS", "right"), ("RUNNING FOR", "right")):
        leases.add_column(name, justify=justify, no_wrap=True)
    for lease in stats.live_leases:
        leases.add_row(lease.execution_id, lease.workflow, str(lease.token), lease.holder,
                       format_duration(max(lease.expires_at - stats.now, 0)), str(lease.renewals),
                       format_duration(max(stats.now - lease.claimed_at, 0)))

    failing = Table(box=None, pad_edge=False)
    for name, justify in (("EXECUTION", "left"), ("WORKFLOW", "left"), ("STATUS", "left"), ("UNACKED", "right"),
                          ("TOKEN", "right")):
        failing.add_column(name, justify=justify, no_wrap=True)
    for record in stats.unacknowledged:
        failing.add_row(record.execution_id, record.workflow, str(record.status),
                        str(record.unacknowledged_deliveries), str(record.token))

    unserved = stats.unserved()
    if unserved:
        waiting = "; ".join(f"{workflow} (" + ", ".join(f"{status} {n}" for status, n in counts.items()) + ")"
                            for workflow, counts in unserved.items())
        due = Text.assemble(due, "\n", (f"not served by any live supervisor: {waiting}", "yellow"))
    parts = [heading, Text(""), counts, due, Text(""), *queue_parts(stats),
             Text(f"live leases: {len(stats.live_leases)}", style="bold"), leases, Text(""),
             Text(f"failing (deliveries that went unacknowledged, most first): {len(stats.unacknowledged)}",
                  style="bold"), failing]
    if note:
        parts.insert(1, Text(note, style="yellow"))
    return Group(*parts)


def queue_parts(stats: LedgerStats) -> list:
    """The queues, when there is more to see than the default queue without limits: their
    limits and counts, as `yieldstar queues` lists them."""
    limited = [q for q in stats.queues if (q.concurrency, q.per_key, q.rate) != (None, None, None)]
    if not limited and len(stats.queues) <= 1:
        return []
    table = Table(box=None, pad_edge=False)
    for i, name in enumerate(QUEUE_HEADINGS):
        table.add_column(name, justify="left" if i in (0, 3) else "right", no_wrap=True)
    for queue in stats.queues:
        table.add_row(*queue_cells(queue))
    return [Text(f"queues: {len(stats.queues)}", style="bold"), table, Text("")]


def run(read: Callable[[], LedgerStats], *, interval: float = 1.0, title: str = "",
        console: Console | None = None) -> None:
    """Show `read()` every `interval` seconds until `q`, Ctrl-C, SIGTERM or SIGHUP; on a
    non-terminal stdout, print one snapshot instead."""
    console = console or Console()
    if not console.is_terminal:
        snapshot = Console(file=console.file, width=max(console.width, 160), force_terminal=False,
                           no_color=True, highlight=False)
        snapshot.print(render(_read_through_busy(read), title=title))
        return
    stop = _StopFlag()
    previous: LedgerStats | None = None
    shown: LedgerStats | None = None
    with stop.on_signals(), keyboard() as keys, Live(console=console, screen=True, auto_refresh=False,
                                                      redirect_stdout=False, redirect_stderr=False) as live:
        try:
            while not stop.set:
                note = ""
                try:
                    stats = read()
                except StorageBusy:
                    note = "the ledger was busy: this refresh was skipped"
                else:
                    previous, shown = shown, stats
                if shown is not None:
                    live.update(render(shown, previous, title=title, note=note, live=True), refresh=True)
                if keys.wait_for(QUIT_KEYS, interval, stop):
                    return
        except KeyboardInterrupt:
            return  # Ctrl-C is how a live view is left: no traceback, exit 0


def _read_through_busy(read: Callable[[], LedgerStats], attempts: int = 5) -> LedgerStats:
    """One reading for a snapshot: a busy database is tried a few times before giving up."""
    for attempt in range(attempts):
        try:
            return read()
        except StorageBusy:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class _StopFlag:
    """Set by SIGTERM or SIGHUP (the handler only sets it; the loop acts)."""

    def __init__(self) -> None:
        self.set = False

    @contextmanager
    def on_signals(self) -> Iterator[None]:
        def handler(signum, frame):
            self.set = True

        saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            yield
        finally:
            for sig, old in saved.items():
                signal.signal(sig, old)


class _Keys:
    def __init__(self, fd: int | None):
        self._fd = fd

    def wait_for(self, wanted: tuple[str, ...], timeout: float, stop: _StopFlag) -> bool:
        """Wait up to `timeout` s; True as soon as one of `wanted` is typed. Other keys are
        ignored; a stop request ends the wait early (at the next `select` wake-up)."""
        deadline = time.monotonic() + timeout
        while not stop.set:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._fd is None:  # no keyboard (stdin is not a terminal): only signals stop us
                time.sleep(min(left, 0.2))
                continue
            ready, _, _ = select.select([self._fd], [], [], min(left, 0.2))
            if ready:
                typed = os.read(self._fd, 64).decode(errors="replace")
                if not typed:  # end of input: the terminal went away
                    return True
                if any(key in typed for key in wanted):
                    return True
        return False


@contextmanager
def keyboard() -> Iterator[_Keys]:
    """stdin in cbreak mode for the block (keys arrive one at a time, unechoed), then exactly
    as it was; when stdin is not a terminal, a reader that never sees a key."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        yield _Keys(None)
        return
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield _Keys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
