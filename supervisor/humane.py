"""Times and durations as people write and read them, for the command line."""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> int:
    """`500ms`, `30s`, `15m`, `2h`, `7d`, `1w`, or a combination such as `1h30m`, in ms."""
    spelled = text.strip().lower() if isinstance(text, str) else ""
    parts = _PART.findall(spelled)
    if not spelled or "".join(number + unit for number, unit in parts) != spelled:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit, like 30s, 15m, 2h or 7d")
    return int(sum(float(number) * _UNITS_MS[unit] for number, unit in parts))
