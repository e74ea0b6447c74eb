"""An execution's lease history laid out as a timeline: one bar per delivery, for inline SVG.

A bar runs from the delivery's claim to its end: when it was acknowledged, released, cancelled,
timed out or fenced, or, for a lease that lapsed, its last expiry (`expired` while nobody has
claimed the execution since, `superseded` once a later claim took it over). A live lease runs to
its current expiry, past the "now" line. So a holder that froze shows as a bar that stops at
its lease's expiry, coloured `superseded`, and its successor as the next bar, starting after the
gap in which nobody held the execution.

The ledger keeps how many times a lease was renewed, not when (`LeaseRecord.renewals`): the bar
carries the count as a mark at its end (`↻3`), not ticks at made-up times.

Pure layout: numbers in, numbers out; the template draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..humane import format_duration
from ..ledger.values import LeaseRecord

WIDTH = 960  # the drawing's width in px: the time axis spans LEFT..WIDTH - RIGHT
LEFT = 8
RIGHT = 8
ROW = 40  # px per delivery: its label above its bar
BAR = 14
AXIS = 28  # px under the last row for the time axis
MIN_BAR = 3  # px: a delivery of a few ms is still seen

# How each delivery ended, as the key's colours (`live`: its lease is held now).
COLOURS = {
    "live": "#1e88e5",
    "acknowledged": "#2e7d32",
    "released": "#00897b",
    "superseded": "#e65100",
    "expired": "#c62828",
    "cancelled": "#616161",
    "timed_out": "#6a1b9a",
    "fenced": "#795548",
}
UNKNOWN_COLOUR = "#9e9e9e"


@dataclass(frozen=True)
class Bar:
    """One delivery's bar: `x`, `y`, `width` in px; `ended` is how it ended (`live` while held).
    Its label reads from the bar's start, or, for a bar in the drawing's right part, ends at the
    bar's end, so that it stays inside the drawing."""

    token: int
    holder: str
    ended: str
    outcome: Optional[str]
    renewals: int
    x: float
    y: int
    width: float
    colour: str
    label: str
    label_x: float  # where the label starts (`anchor` "start") or ends ("end"): over the bar, inside the drawing
    anchor: str


@dataclass(frozen=True)
class Gap:
    """The time between a lapsed lease's expiry and the claim that superseded it, when nobody
    held the execution: a dotted line from `x1` to `x2` at `y`, with how long it lasted."""

    x1: float
    x2: float
    y: int
    label: str


@dataclass(frozen=True)
class Timeline:
    """The bars, the gaps after lapsed leases, the drawing's height, the "now" line's x (None:
    outside the span) and the span."""

    bars: list[Bar]
    gaps: list[Gap]
    height: int
    now_x: Optional[float]
    start: int
    end: int

    @property
    def span(self) -> str:
        return format_duration(self.end - self.start)


def lay_out(history: list[LeaseRecord], now: int) -> Timeline:
    """The bars of `history` (oldest first, as `executions.history` returns it) as of `now`."""
    if not history:
        return Timeline(bars=[], gaps=[], height=0, now_x=None, start=now, end=now)
    ends = [_end(lease) for lease in history]
    start = min(lease.claimed_at for lease in history)
    end = max(max(ends), now if any(lease.ended_by is None for lease in history) else start)
    scale = (WIDTH - LEFT - RIGHT) / max(end - start, 1)
    bars = []
    for row, (lease, ended_at) in enumerate(zip(history, ends)):
        ended = "live" if lease.ended_by is None else str(lease.ended_by)
        x = round(min(LEFT + (lease.claimed_at - start) * scale, WIDTH - RIGHT - MIN_BAR), 1)
        width = round(max((ended_at - lease.claimed_at) * scale, MIN_BAR), 1)
        leftish = x < WIDTH / 2
        bars.append(Bar(token=lease.token, holder=lease.holder, ended=ended,
                        outcome=None if lease.outcome is None else str(lease.outcome), renewals=lease.renewals,
                        x=x, y=row * ROW + 18, width=width, colour=COLOURS.get(ended, UNKNOWN_COLOUR),
                        label=_label(lease, ended, ended_at), label_x=x if leftish else min(x + width, WIDTH - RIGHT),
                        anchor="start" if leftish else "end"))
    gaps = [Gap(x1=round(before.x + before.width, 1), x2=after.x, y=after.y + BAR // 2,
                label="no holder for " + format_duration(after_lease.claimed_at - before_end))
            for before, after, before_end, after_lease in zip(bars, bars[1:], ends, history[1:])
            if before.ended == "superseded" and after.x > before.x + before.width]
    now_x = LEFT + (now - start) * scale if start <= now <= end else None
    return Timeline(bars=bars, gaps=gaps, height=len(bars) * ROW + AXIS, now_x=None if now_x is None else round(now_x, 1),
                    start=start, end=end)


def _end(lease: LeaseRecord) -> int:
    """Where the bar stops: the delivery's end, or a live lease's current expiry."""
    return lease.expires_at if lease.ended_at is None else lease.ended_at


def _label(lease: LeaseRecord, ended: str, ended_at: int) -> str:
    renewed = f", renewed {lease.renewals}×" if lease.renewals else ""
    if ended == "live":
        return f"token {lease.token} · {lease.holder} · live lease{renewed}"
    how = ended if lease.outcome is None else f"{ended} ({lease.outcome})"
    held = format_duration(max(ended_at - lease.claimed_at, 0))
    return f"token {lease.token} · {lease.holder} · {how} after {held}{renewed}"
