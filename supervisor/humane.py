"""Times and durations as people write and read them, for the command line.

The ledger speaks integer ms since the epoch; an operator reads local ISO-8601 times with a
hint of how far away they are (`2026-12-02T19:40:03+00:00 (3 min ago)`) and writes either an
ISO time, a duration (`30s`, `15m`, `7d`, `1h30m`) or, in scripts, plain epoch ms. `--json`
output keeps epoch ms: this module is for text output and option parsing only.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone, tzinfo

from .ledger.arguments import MAX_TIME_MS, MIN_TIME_MS, TIME_RANGE

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_EPOCH_MS = re.compile(r"-?\d+")


def parse_duration(text: str) -> int:
    """`500ms`, `30s`, `15m`, `2h`, `7d`, `1w`, or a combination such as `1h30m`, in ms.

    Raises:
        ValueError: `text` is no duration (the message quotes it and shows how to write one).
    """
    spelled = text.strip().lower() if isinstance(text, str) else ""
    parts = _PART.findall(spelled)
    if not spelled or "".join(number + unit for number, unit in parts) != spelled:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit, like 30s, 15m, 2h or 7d")
    return int(sum(float(number) * _UNITS_MS[unit] for number, unit in parts))


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(b|kb|kib|mb|mib|gb|gib)?")
_UNITS_BYTES = {None: 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000 ** 2, "mib": 1024 ** 2, "gb": 1000 ** 3,
                "gib": 1024 ** 3}


def parse_size(text: str) -> int:
    """A size in bytes: a number of bytes (`4194304`), or a number and a unit (`8MB`, `512KiB`,
    `1.5 MiB`): KB, MB and GB are powers of 1000, KiB, MiB and GiB powers of 1024.

    Raises:
        ValueError: `text` is no size, or not at least one byte (the message quotes it).
    """
    found = _SIZE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{text!r} is not a size: write a number of bytes, or a number and a unit, like 8MB or 512KiB")
    size = int(float(found[1]) * _UNITS_BYTES[found[2]])
    if size < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return size


def parse_time(text: str, *, now: int, future: bool = False, option: str = "time") -> int:
    """An operator's time option, in epoch ms.

    Accepts an ISO-8601 time (`2026-12-02T19:40:03+01:00`, `2026-12-02 19:40`, `2026-12-02`;
    without an offset it is local time; `Z` means UTC), a duration counted back from `now`
    (or forward with `future=True`: `wake --at 30s` is thirty seconds from now), or an integer,
    taken as epoch ms as it stands (for scripts).

    Raises:
        ValueError: none of these, or a time the ledger cannot hold; the message names `option` and
            quotes the text.
    """
    spelled = text.strip() if isinstance(text, str) else ""
    if _EPOCH_MS.fullmatch(spelled):
        return _held(int(spelled), text, option)
    try:
        offset = parse_duration(spelled)
    except ValueError:
        pass
    else:
        return _held(now + offset if future else now - offset, text, option)
    try:
        # Python 3.10's fromisoformat does not read a trailing `Z`.
        moment = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", spelled))
    except ValueError:
        raise ValueError(
            f"{option} {text!r} is not a time: write an ISO-8601 time (2026-12-02T19:40:03+00:00), a duration"
            f" {'from now' if future else 'back from now'} (30s, 15m, 7d) or ms since the epoch"
        ) from None
    try:
        if moment.tzinfo is None:
            moment = moment.astimezone()  # a naive time is the local time of this machine
        ms = round(moment.timestamp() * 1000)
    except (ValueError, OverflowError):  # a time at the edge of what datetime holds
        ms = MIN_TIME_MS - 1
    return _held(ms, text, option)


def _held(ms: int, text: str, option: str) -> int:
    """`ms`, if the ledger can hold that time; else a ValueError naming `option` and the range."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise ValueError(f"{option} {text!r} is outside the times the ledger holds: {TIME_RANGE}, in ms since the"
                         " epoch")
    return ms


def format_time(ms: int | None, *, now: int | None = None, tz: tzinfo | None = None) -> str:
    """`2026-12-02T19:40:03+00:00 (3 min ago)`: local time (or `tz`) to the second with its
    offset, and, given `now`, how far away it is. None reads `-` (no such time)."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone(tz)
    text = moment.isoformat(timespec="seconds")
    return text if now is None else f"{text} ({relative(ms, now)})"


def relative(ms: int, now: int) -> str:
    """`3 min ago`, `in 2 s`, or `now` (within a second either way)."""
    delta = ms - now
    if abs(delta) < 1000:
        return "now"
    span = format_duration(abs(delta))
    return f"in {span}" if delta > 0 else f"{span} ago"


def format_duration(ms: int) -> str:
    """A duration in its largest whole unit, rounded down: `850 ms`, `4 s`, `3 min`, `5 h`, `2 d`."""
    ms = int(ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        # Two of a unit before switching to it keeps a hint close: `90 s`, not `1 min`.
        if abs(ms) >= 2 * size or (unit == "s" and abs(ms) >= size):
            return f"{ms // size} {unit}"
    return f"{ms} ms"


QUEUE_HEADINGS = ("QUEUE", "CONCURRENCY", "PER KEY", "RATE", "DUE", "RUNNING", "WAITING")


def queue_cells(queue) -> tuple[str, ...]:
    """A queue (`QueueRecord`) as the cells of a row: name, concurrency, per key, rate, due,
    running, waiting; `-` for no limit."""
    rate = "-" if queue.rate is None else f"{queue.rate[0]} per {queue.rate[1]:g} s"
    return (queue.name, _limit(queue.concurrency), _limit(queue.per_key), rate, str(queue.due), str(queue.running),
            str(queue.waiting))


def _limit(value) -> str:
    return "-" if value is None else str(value)
