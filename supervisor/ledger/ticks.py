"""A workflow's schedule (SPEC section 12), and the times it ticks at: pure computation, no storage.

Both sides import it: the worker builds a `Schedule` when `@workflow(..., schedule=/every=)`
decorates a function (and so refuses a bad one at import), and the ledger's `schedules` table
asks it which tick is due (`tables.schedules`). Times are integer ms since the Unix epoch, as
everywhere in the ledger; a tick is a whole second.

    every=S             ticks at every whole multiple of S seconds since the epoch (UTC)
    schedule="CRON"     ticks at the minutes the expression matches (a sixth field, first, adds
                        seconds), in UTC, or in `timezone` (an IANA name) when one is given

Cron expressions are read and evaluated by `cronsim` (the `schedules` extra: `pip install
'yieldstar[schedules]'`), imported only when a cron schedule is built, so a worker whose app
has none starts without it. cronsim follows Debian's cron, daylight-saving changes included:

    spring forward   a job at a fixed time that falls in the skipped hour (Europe/Paris 02:30 on
                     the last Sunday of March) runs once, at the first instant after the change
                     (03:00 local, 01:00 UTC); a job that runs more often than hourly ("*/15 * *
                     * *") has no tick in the skipped hour: those local times do not exist
    fall back        a job at a fixed time in the repeated hour (02:30 on the last Sunday of
                     October) runs once, at its first occurrence (02:30 CEST, 00:30 UTC); a job
                     that runs more often than hourly ticks in both passes of the hour, since
                     they are distinct instants (UTC 00:00-01:00 and 01:00-02:00)

Every tick is a distinct UTC instant, so an id (`tick_id`) is never issued twice by one schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone as _timezone
from typing import Optional

from .errors import InvalidArgument

__all__ = ["Schedule", "schedule_of", "tick_text", "tick_id", "tick_input", "latest_tick", "next_tick"]

UTC = _timezone.utc
# cronsim stops looking for a match this far ahead (it raises StopIteration after 50 years):
# a tick that never comes is `None`.
_NEVER = None


@dataclass(frozen=True)
class Schedule:
    """A workflow's schedule: `cron` (with its `timezone`, None: UTC) or `every_ms`, not both."""

    workflow: str
    cron: Optional[str] = None
    timezone: Optional[str] = None
    every_ms: Optional[int] = None

    @property
    def spec(self) -> str:
        """How the ledger and `yieldstar schedules` show it: the cron expression, or "every S s"."""
        if self.cron is not None:
            return self.cron
        seconds = self.every_ms / 1000
        return f"every {seconds:g}s"


def schedule_of(workflow: str, *, schedule: Optional[str] = None, timezone: Optional[str] = None,
                every: Optional[float] = None) -> Optional[Schedule]:
    """The `Schedule` that `@workflow(workflow, schedule=, timezone=, every=)` declares, or None.

    Raises:
        InvalidArgument: both `schedule` and `every`; `timezone` without `schedule`; `every`
            not a finite number > 0 (or below a millisecond); a cron expression or a time zone
            that cannot be read (the message names it); a cron schedule without the
            `schedules` extra installed.
    """
    if schedule is not None and every is not None:
        raise InvalidArgument(f"@workflow({workflow!r}) takes schedule= (cron) or every= (seconds), not both")
    if timezone is not None and schedule is None:
        raise InvalidArgument(f"@workflow({workflow!r}): timezone={timezone!r} applies to a cron schedule= only"
                              " (every= ticks on multiples of its seconds since the epoch, in no zone)")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every) or every <= 0:
            raise InvalidArgument(f"@workflow({workflow!r}): every= must be a finite number of seconds > 0,"
                                  f" not {every!r}")
        every_ms = round(every * 1000)
        if every_ms < 1:
            raise InvalidArgument(f"@workflow({workflow!r}): every={every!r} is below a millisecond")
        return Schedule(workflow, every_ms=every_ms)
    if schedule is None:
        return None
    if not isinstance(schedule, str) or not schedule.strip():
        raise InvalidArgument(f"@workflow({workflow!r}): schedule= must be a cron expression (str), not {schedule!r}")
    cron = " ".join(schedule.split())
    if timezone is not None:
        _zone(workflow, timezone)
    try:
        _cronsim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except InvalidArgument:
        raise
    except Exception as exc:  # cronsim.CronSimError: "Bad minute", ...
        raise InvalidArgument(f"@workflow({workflow!r}): invalid cron expression {schedule!r}: {exc}") from None
    return Schedule(workflow, cron=cron, timezone=timezone)


def tick_text(tick_ms: int) -> str:
    """A tick as its id and input show it: UTC, ISO 8601 to the second, with a trailing Z."""
    return datetime.fromtimestamp(tick_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_id(workflow: str, tick_ms: int) -> str:
    """The execution id of a tick: `nightly@2026-12-06T03:00:00Z`."""
    return f"{workflow}@{tick_text(tick_ms)}"


def tick_input(tick_ms: int) -> dict:
    """The input of a tick's execution."""
    return {"scheduled_at": tick_text(tick_ms)}


def latest_tick(schedule: Schedule, at_ms: int) -> Optional[int]:
    """The latest tick at or before `at_ms`, or None (a cron expression with none in 50 years)."""
    if schedule.every_ms is not None:
        return _whole_seconds(at_ms // schedule.every_ms * schedule.every_ms, down=True, step=schedule.every_ms)
    # cronsim's reverse iteration yields matches strictly before its start: start a second later.
    start = _local(schedule, _floor_second(at_ms) + 1000)
    return _first(schedule, start, reverse=True)


def next_tick(schedule: Schedule, after_ms: int) -> Optional[int]:
    """The first tick strictly after `after_ms`, or None (a cron expression with none in 50 years)."""
    if schedule.every_ms is not None:
        return _whole_seconds((after_ms // schedule.every_ms + 1) * schedule.every_ms, down=False,
                              step=schedule.every_ms)
    return _first(schedule, _local(schedule, _floor_second(after_ms)), reverse=False)


def _whole_seconds(tick_ms: int, *, down: bool, step: int) -> int:
    """An `every=` tick is a whole multiple of its period; one that is not a whole second (every=0.5
    at 0.5 s) still names the second it falls in, so ids of periods below a second would repeat:
    such ticks are moved to the next multiple that is a whole second."""
    while tick_ms % 1000:
        tick_ms += -step if down else step
    return tick_ms


def _floor_second(ms: int) -> int:
    return ms // 1000 * 1000


def _local(schedule: Schedule, ms: int) -> datetime:
    zone = UTC if schedule.timezone is None else _zone(schedule.workflow, schedule.timezone)
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone)


def _first(schedule: Schedule, start: datetime, *, reverse: bool) -> Optional[int]:
    try:
        found = next(_cronsim(schedule.cron, start, reverse=reverse))
    except StopIteration:
        return _NEVER
    return round(found.timestamp()) * 1000


def _cronsim(cron: str, start: datetime, *, reverse: bool = False):
    try:
        from cronsim import CronSim
    except ImportError:
        raise InvalidArgument("a cron schedule= needs cronsim: pip install 'yieldstar[schedules]'") from None
    return CronSim(cron, start, reverse=reverse)


def _zone(workflow: str, name: str):
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"@workflow({workflow!r}): timezone= must be an IANA zone name, not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"@workflow({workflow!r}): unknown time zone {name!r} (an IANA name such as"
                              " 'Europe/Paris'; where the system has no zone database, pip install tzdata)") from None

