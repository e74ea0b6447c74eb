"""What the command line checks of its options and arguments before it calls the library, so that
a bad value is refused naming the option or argument as the user typed it (`--id`, `ID`,
`--lease-ms`), not the library's parameter (`execution_id`, `lease_ms`), and before anything is
opened or written.

The library checks the same values again, and its messages name its own parameters: they are
right for a caller of the library, and this module is what keeps them off the command line.
"""

from __future__ import annotations

import math

import click

from ..ledger import arguments
from ..ledger.errors import InvalidArgument

# The longest a supervisor's timing option may be (30 days): far longer than any lease, renewal,
# heartbeat, poll or grace period needs, and short enough that every wait made of it fits the
# clock functions' limits and every lease's end fits the times the ledger holds.
MAX_TIMING_MS = 30 * 86_400_000
timing_ms = click.IntRange(min=1, max=MAX_TIMING_MS)

# A priority is stored as a 32-bit int on both backends.
priority = click.IntRange(min=-2 ** 31, max=2 ** 31 - 1)


def shown_name(param: click.Parameter) -> str:
    """The option (`--id`) or argument (`ID`, its metavar) as the user wrote it."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def identifier(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: an id or a name (`ID`, `WORKFLOW`, `--queue`), checked as the ledger
    checks ids (not empty nor blank, at most 255 characters, no control characters)."""
    if value is None:
        return None
    try:
        return arguments.identifier(shown_name(param), value)
    except InvalidArgument as exc:
        raise click.UsageError(str(exc), ctx) from None


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a path or a name that may be long but not empty (`DEST`, `APP`)."""
    if value is not None and not value.strip():
        raise click.UsageError(f"{shown_name(param)} must not be empty" if not value
                               else f"{shown_name(param)} {value!r} is blank", ctx)
    return value


class Seconds(click.ParamType):
    """A finite number of seconds from `low` to `high` (click's FloatRange lets 'nan' through, and
    with no upper bound 'inf' too, which then overflow or spin the loops that wait on them)."""

    name = "seconds"

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def convert(self, value, param, ctx) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not self.low <= seconds <= self.high:
            self.fail(f"{value} is not a number of seconds from {self.low:g} to {self.high:g}", param, ctx)
        return seconds

    def get_metavar(self, param, *args, **kwargs) -> str:  # click 8.1 passes param; 8.2 and later ctx too, by keyword
        return "SECONDS"


def listen_address(option: str, text: str, example: int) -> tuple[str, int]:
    """Where a server of ours listens (`ui --addr`, `supervise --metrics`): a port alone, on
    loopback (nothing listens beyond this host unless asked), or `HOST:PORT` (`[HOST]:PORT` for
    an IPv6 address); port 0 takes any free one.

    Raises:
        ValueError: not an address; the message names `option` and gives `example` as a port.
    """
    spelled = str(text).strip()
    if spelled.isascii() and spelled.isdigit():
        host, port = "127.0.0.1", spelled
    elif spelled.startswith("[") and "]:" in spelled:
        host, port = spelled[1:].split("]:", 1)
    elif spelled.count(":") == 1:
        host, port = spelled.split(":")
    else:
        host, port = "", ""
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{option} {text!r} is not an address: write a port alone (loopback) or HOST:PORT,"
                         f" e.g. {example}, 127.0.0.1:{example} or [::1]:{example}")
    return host, int(port)
