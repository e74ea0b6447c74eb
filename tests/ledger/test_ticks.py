"""Schedules' ticks (SPEC section 12), computed without a ledger: `every=` on whole multiples of
its seconds since the epoch, cron in UTC and in a time zone across both daylight-saving changes
of a year (cronsim's Debian-cron semantics, stated in `supervisor.ledger.ticks`), the tick's id
and input, and the errors of `@workflow(..., schedule=, timezone=, every=)` at decoration."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.ticks import latest_tick, next_tick, schedule_of, tick_id, tick_input, tick_text
from worker import Registry

pytestmark = pytest.mark.timeout(30)


def ms(*when) -> int:
    return int(datetime(*when, tzinfo=timezone.utc).timestamp()) * 1000


def ticks(schedule, start_ms: int, count: int) -> list[str]:
    out, at = [], start_ms
    for _ in range(count):
        at = next_tick(schedule, at)
        out.append(tick_text(at))
    return out


# -- every= ------------------------------------------------------------------------------------


def test_every_ticks_on_whole_multiples_of_its_seconds_since_the_epoch():
    every = schedule_of("t", every=2.0)
    assert next_tick(every, ms(2026, 12, 6, 3, 0, 1)) == ms(2026, 12, 6, 3, 0, 2)
    assert next_tick(every, ms(2026, 12, 6, 3, 0, 2)) == ms(2026, 12, 6, 3, 0, 4)  # strictly after
    assert latest_tick(every, ms(2026, 12, 6, 3, 0, 2)) == ms(2026, 12, 6, 3, 0, 2)  # at or before
    assert latest_tick(every, ms(2026, 12, 6, 3, 0, 3) + 999) == ms(2026, 12, 6, 3, 0, 2)
    seven = schedule_of("t", every=7)
    assert all(tick % 7000 == 0 for tick in (next_tick(seven, at) for at in range(0, 100_000, 333)))
    assert schedule_of("t", every=2.0).spec == "every 2s" and schedule_of("t", every=0.5).spec == "every 0.5s"


def test_every_below_a_second_ticks_only_on_whole_seconds_so_that_no_id_repeats():
    half = schedule_of("t", every=0.5)
    assert ticks(half, 10_000, 3) == [tick_text(11_000), tick_text(12_000), tick_text(13_000)]
    assert latest_tick(half, 11_700) == 11_000
    one_and_a_half = schedule_of("t", every=1.5)
    assert [next_tick(one_and_a_half, at) for at in (0, 3_000)] == [3_000, 6_000]


# -- cron -------------------------------------------------------------------------------------


def test_cron_in_utc_ticks_on_its_minutes():
    nightly = schedule_of("n", schedule="0 3 * * *")
    assert next_tick(nightly, ms(2026, 12, 5, 10, 0)) == ms(2026, 12, 6, 3, 0)
    assert next_tick(nightly, ms(2026, 12, 6, 3, 0)) == ms(2026, 12, 7, 3, 0)
    assert latest_tick(nightly, ms(2026, 12, 6, 3, 0)) == ms(2026, 12, 6, 3, 0)
    assert latest_tick(nightly, ms(2026, 12, 6, 3, 0) - 1) == ms(2026, 12, 5, 3, 0)
    quarter = schedule_of("q", schedule="*/15 * * * *")
    assert ticks(quarter, ms(2026, 12, 6, 23, 50), 3) == ["2026-12-07T00:00:00Z", "2026-12-07T00:15:00Z",
                                                          "2026-12-07T00:30:00Z"]
    assert schedule_of("n", schedule="0  3 * *   *").spec == "0 3 * * *"  # spaces made single


def test_cron_in_a_time_zone_follows_its_offset():
    paris = schedule_of("n", schedule="0 3 * * *", timezone="Europe/Paris")
    assert next_tick(paris, ms(2026, 12, 5, 10, 0)) == ms(2026, 12, 6, 2, 0)  # CET, UTC+1
    assert next_tick(paris, ms(2026, 7, 5, 10, 0)) == ms(2026, 7, 6, 1, 0)  # CEST, UTC+2


def test_spring_forward_a_fixed_time_in_the_skipped_hour_runs_once_right_after_the_change():
    # Europe/Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist.
    at_0230 = schedule_of("n", schedule="30 2 * * *", timezone="Europe/Paris")
    assert ticks(at_0230, ms(2026, 3, 27, 12), 3) == ["2026-03-28T01:30:00Z",  # 02:30 CET
                                                      "2026-03-29T01:00:00Z",  # 03:00 CEST, at once
                                                      "2026-03-30T00:30:00Z"]  # 02:30 CEST
    # A job that runs more often than hourly has no tick in the hour that does not exist.
    half_hourly = schedule_of("h", schedule="*/30 * * * *", timezone="Europe/Paris")
    assert ticks(half_hourly, ms(2026, 3, 29, 0, 0), 4) == ["2026-03-29T00:30:00Z",  # 01:30 CET
                                                            "2026-03-29T01:00:00Z",  # 03:00 CEST
                                                            "2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z"]


def test_fall_back_a_fixed_time_in_the_repeated_hour_runs_once_and_a_frequent_job_in_both_passes():
    # Europe/Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:00-03:00 happens twice.
    at_0230 = schedule_of("n", schedule="30 2 * * *", timezone="Europe/Paris")
    assert ticks(at_0230, ms(2026, 10, 23, 12), 3) == ["2026-10-24T00:30:00Z",  # 02:30 CEST
                                                       "2026-10-25T00:30:00Z",  # the first 02:30 only
                                                       "2026-10-26T01:30:00Z"]  # 02:30 CET
    half_hourly = schedule_of("h", schedule="*/30 * * * *", timezone="Europe/Paris")
    assert ticks(half_hourly, ms(2026, 10, 24, 23, 45), 5) == [
        "2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z",  # 02:00, 02:30 CEST
        "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z",  # 02:00, 02:30 CET
        "2026-10-25T02:00:00Z"]


def test_ticks_across_a_year_of_a_zone_are_distinct_and_increasing():
    hourly = schedule_of("h", schedule="0 * * * *", timezone="America/New_York")
    found, at = [], ms(2026, 1, 1)
    while at < ms(2027, 1, 1):
        at = next_tick(hourly, at)
        found.append(at)
    assert found == sorted(set(found))
    assert len(found) == 365 * 24 - 1 + 1  # one local hour skipped in March; the repeated one ticks twice
    assert all(latest_tick(hourly, tick) == tick for tick in found[:200])


def test_a_cron_that_never_matches_has_no_next_tick():
    # Every minute of the 1st and 21st of a month that is also its last Monday (cronsim's example).
    never = schedule_of("n", schedule="* * */20 * 1L")
    assert next_tick(never, ms(2026, 1, 1)) is None and latest_tick(never, ms(2026, 1, 1)) is None


# -- the tick's execution -----------------------------------------------------------------------


def test_a_tick_is_named_in_utc_to_the_second_with_a_trailing_z():
    tick = ms(2026, 12, 6, 3, 0)
    assert tick_text(tick) == "2026-12-06T03:00:00Z"
    assert tick_id("nightly", tick) == "nightly@2026-12-06T03:00:00Z"
    assert tick_input(tick) == {"scheduled_at": "2026-12-06T03:00:00Z"}
    assert tick_text(0) == "1970-01-01T00:00:00Z"


# -- declaring a schedule -----------------------------------------------------------------------


def test_a_registry_keeps_the_schedules_of_its_workflows():
    registry = Registry()

    @registry.workflow("nightly", schedule="0 3 * * *", timezone="Europe/Paris")
    def nightly(ctx, input):
        return input

    @registry.workflow("tick", every=2.0)
    def tick(ctx, input):
        return input

    @registry.workflow("plain")
    def plain(ctx, input):
        return input

    assert [(s.workflow, s.cron, s.timezone, s.every_ms) for s in registry.schedules()] == [
        ("nightly", "0 3 * * *", "Europe/Paris", None), ("tick", None, None, 2000)]
    assert registry.names() == ["nightly", "plain", "tick"]


@pytest.mark.parametrize("arguments, message", [
    (dict(schedule="61 * * * *"), r"invalid cron expression '61 \* \* \* \*': Bad minute"),
    (dict(schedule="0 3 * *"), r"invalid cron expression '0 3 \* \*'"),
    (dict(schedule="0 0 30 2 *"), r"invalid cron expression '0 0 30 2 \*': Bad day-of-month"),  # 30 February
    (dict(schedule="every day"), r"invalid cron expression 'every day'"),
    (dict(schedule=""), r"schedule= must be a cron expression"),
    (dict(schedule=5), r"schedule= must be a cron expression"),
    (dict(schedule="0 3 * * *", timezone="Mars/Olympus_Mons"), r"unknown time zone 'Mars/Olympus_Mons'"),
    (dict(schedule="0 3 * * *", timezone="../etc/passwd"), r"unknown time zone '\.\./etc/passwd'"),
    (dict(every=0), r"every= must be a finite number of seconds > 0, not 0"),
    (dict(every=-1), r"every= must be a finite number of seconds > 0, not -1"),
    (dict(every=math.inf), r"every= must be a finite number of seconds > 0, not inf"),
    (dict(every=math.nan), r"every= must be a finite number of seconds > 0, not nan"),
    (dict(every="2"), r"every= must be a finite number of seconds > 0, not '2'"),
    (dict(every=True), r"every= must be a finite number of seconds > 0, not True"),
    (dict(every=0.0001), r"below a millisecond"),
    (dict(schedule="* * * * *", every=1), r"schedule= \(cron\) or every= \(seconds\), not both"),
    (dict(timezone="Europe/Paris"), r"timezone='Europe/Paris' applies to a cron schedule= only"),
    (dict(every=1, timezone="Europe/Paris"), r"applies to a cron schedule= only"),
])
def test_a_bad_schedule_is_refused_at_decoration_naming_what_is_wrong(arguments, message):
    registry = Registry()
    with pytest.raises(InvalidArgument, match=r"@workflow\('bad'\).*" + message):
        registry.workflow("bad", **arguments)
    assert registry.names() == [] and registry.schedules() == []


def test_a_cron_schedule_without_cronsim_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if not installed: its import fails
    with pytest.raises(InvalidArgument, match=r"needs cronsim: pip install 'yieldstar\[schedules\]'"):
        Registry().workflow("nightly", schedule="0 3 * * *")
    assert schedule_of("tick", every=2).every_ms == 2000  # every= does not need it


def test_a_worker_whose_app_has_no_cron_schedule_never_imports_cronsim_or_zoneinfo(tmp_path):
    app = tmp_path / "every_app.py"
    app.write_text("from worker import workflow\n\n@workflow('tick', every=1)\ndef tick(ctx, input):\n    return 1\n")
    code = ("import sys; from worker._runtime.loading import load_app; load_app(sys.argv[1]);"
            " print(sorted(m for m in ('cronsim', 'zoneinfo') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code, str(app)], capture_output=True, text=True, timeout=30,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
