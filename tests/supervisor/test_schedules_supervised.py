"""Schedules with real processes (SPEC section 12), on a SQLite file and on PostgreSQL: two
supervisors serving `sc.tick` (every second) admit each tick exactly once between them and miss
none; one killed with SIGKILL and started again doubles none; after a downtime of several ticks
only the latest missed one is admitted; `--until-idle` runs a tick missed before it started and
does not wait for the next one. `yieldstar schedules` lists them.

The app is `tests/apps/schedules_app.py`. Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import datetime, timezone

import pytest

from faults import TESTS, cli, wait_gone, wait_until
from supervisor.ledger.ticks import latest_tick, schedule_of, tick_id

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(120), pytest.mark.slow]

APP = str(TESTS / "apps" / "schedules_app.py")
ADMITTED = re.compile(r"schedule sc\.tick: admitted execution (sc\.tick@\S+)")
NIGHTLY = schedule_of("sc.nightly", schedule="0 3 * * *", timezone="Europe/Paris")


def tick_of(execution_id: str) -> int:
    """The tick (ms) an execution id names."""
    when = execution_id.partition("@")[2]
    return int(datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()) * 1000


def ticks(ledger) -> list[int]:
    """The ticks of `sc.tick` in the ledger, in order."""
    return sorted(tick_of(e.execution_id) for e in ledger.executions.list(workflow="sc.tick"))


def admissions(*processes) -> list[str]:
    """Every `sc.tick` admission the supervisors logged (one line per admission that won)."""
    return [m.group(1) for p in processes for m in ADMITTED.finditer(p.log())]


def assert_no_gap(found: list[int]) -> None:
    assert found == list(range(found[0], found[-1] + 1000, 1000)), found


def wait_ticks(ledger, count: int, after: int = 0, timeout: float = 30) -> list[int]:
    """Wait until `count` ticks later than `after` are in the ledger, and every one completed."""
    def enough():
        found = [t for t in ticks(ledger) if t > after]
        done = all(ledger.executions.get(tick_id("sc.tick", t)).status == "completed" for t in found)
        return found if len(found) >= count and done else None
    return wait_until(enough, timeout, message=f"{count} ticks of sc.tick after {after}")


def stop(*processes) -> None:
    for process in processes:
        process.signal(signal.SIGTERM)
    for process in processes:
        assert process.wait(30) == 0


def test_two_supervisors_admit_each_tick_exactly_once_and_miss_none(each_backend, each_ledger, supervisors):
    first = supervisors.start(each_backend, app=APP, concurrency=2)
    second = supervisors.start(each_backend, app=APP, concurrency=2)
    second.wait_log("keeping 2 schedules")
    joined = each_ledger.clock()
    wait_ticks(each_ledger, 5, after=joined)
    stop(first, second)

    found = ticks(each_ledger)
    assert_no_gap(found)
    logged = admissions(first, second)
    assert sorted(logged) == sorted(tick_id("sc.tick", t) for t in found)  # each once, by one of them
    for tick in found:
        execution = each_ledger.executions.get(tick_id("sc.tick", tick))
        assert json.loads(execution.input_json) == {"scheduled_at": execution.execution_id.partition("@")[2]}
        assert json.loads(execution.result_json) == json.loads(execution.input_json)
        assert [(h.token, h.ended_by) for h in each_ledger.executions.history(execution.execution_id)] == [
            (1, "acknowledged")]
        assert tick <= execution.created_at < tick + 1000  # never before its time, and in time

    listed = {s["name"]: s for s in json.loads(cli(each_backend, "schedules", "--json").stdout)}
    assert set(listed) == {"sc.tick", "sc.nightly"}
    assert (listed["sc.tick"]["spec"], listed["sc.tick"]["timezone"], listed["sc.tick"]["last_tick"]) == (
        "every 1s", None, found[-1])
    assert listed["sc.tick"]["last_id"] == tick_id("sc.tick", found[-1])
    assert listed["sc.tick"]["next_tick"] == found[-1] + 1000
    assert (listed["sc.nightly"]["spec"], listed["sc.nightly"]["timezone"], listed["sc.nightly"]["last_tick"]) == (
        "0 3 * * *", "Europe/Paris", None)
    assert listed["sc.nightly"]["next_tick"] > each_ledger.clock()
    text = cli(each_backend, "schedules").stdout
    assert "sc.nightly  0 3 * * *  Europe/Paris" in text and "every 1s" in text, text


def test_a_supervisor_killed_and_restarted_doubles_no_tick_and_after_a_downtime_only_the_latest_missed_is_admitted(
        each_backend, each_ledger, supervisors):
    first = supervisors.start(each_backend, app=APP, concurrency=2)
    second = supervisors.start(each_backend, app=APP, concurrency=2)
    wait_ticks(each_ledger, 3, after=each_ledger.clock())

    # One is killed (its workers with it) while the other goes on; then it starts again.
    first.kill_everything()
    wait_gone(first.seen_pids | {first.pid})
    wait_ticks(each_ledger, 3, after=each_ledger.clock())
    again = supervisors.start(each_backend, app=APP, concurrency=2)
    again.wait_log("keeping 2 schedules")
    wait_ticks(each_ledger, 3, after=each_ledger.clock())

    # Both killed: nobody runs for several ticks.
    second.kill_everything()
    again.kill_everything()
    wait_gone(second.seen_pids | again.seen_pids | {second.pid, again.pid})
    before = ticks(each_ledger)
    assert_no_gap(before)  # through the kill and the restart: no tick missed
    down_since = each_ledger.clock()
    wait_until(lambda: each_ledger.clock() >= down_since + 5_500, 15, message="five ticks of downtime")

    back = supervisors.start(each_backend, app=APP, concurrency=2)
    after = wait_ticks(each_ledger, 3, after=before[-1])
    stop(back)

    assert after[0] - before[-1] >= 5_000, (before[-1], after)  # the ticks of the downtime...
    assert_no_gap(after)  # ...only the latest of them admitted, then every tick from the next on
    first_after = [m for m in admissions(back)][0]
    assert first_after == tick_id("sc.tick", after[0])
    logged = admissions(first, second, again, back)
    assert len(logged) == len(set(logged)), "a tick was admitted twice"
    assert set(logged) <= {tick_id("sc.tick", t) for t in before + after}
    # A delivery cut short by a kill is delivered again (its tick is not admitted again): all complete.
    wait_until(lambda: all(each_ledger.executions.get(tick_id("sc.tick", t)).status == "completed"
                           for t in before + after), 30, message="every tick's execution completed")


def test_until_idle_runs_a_missed_tick_and_does_not_wait_for_the_next(each_backend, each_ledger, supervisors):
    # The schedules were recorded a day and a half ago by a supervisor that ran then: the ticks
    # since are missed, and only the latest of each is admitted.
    long_ago = each_ledger.clock() - 36 * 3600 * 1000
    tick_every_1 = schedule_of("sc.tick", every=1)
    each_ledger.schedules.admit_due([tick_every_1, NIGHTLY], now=long_ago)

    started = time.monotonic()
    process = supervisors.start(each_backend, app=APP, concurrency=2, until_idle=True, ready=False)
    assert process.wait(60) == 0
    assert "idle: nothing running and nothing due" in process.log()

    nightly = [e for e in each_ledger.executions.list(workflow="sc.nightly")]
    assert len(nightly) == 1, nightly
    missed = latest_tick(NIGHTLY, nightly[0].created_at)
    assert nightly[0].execution_id == tick_id("sc.nightly", missed) and nightly[0].status == "completed"
    assert re.fullmatch(r"sc\.nightly@\d{4}-\d\d-\d\dT0[12]:00:00Z", nightly[0].execution_id)  # 03:00 in Paris
    found = ticks(each_ledger)
    assert found and all(each_ledger.executions.get(tick_id("sc.tick", t)).status == "completed" for t in found)
    (record,) = [r for r in each_ledger.schedules.list() if r.name == "sc.nightly"]
    assert record.last_tick == missed and record.next_tick > each_ledger.clock()  # not waited for
    assert time.monotonic() - started < 30


def test_a_schedule_the_app_no_longer_has_is_forgotten_when_its_supervisor_starts(each_backend, each_ledger,
                                                                                  supervisors):
    """The latest start wins, as for queue limits: `sc.tick` served without a schedule is no
    longer listed nor ticked; `sc.nightly`, which the new app does not serve, is kept."""
    each_ledger.schedules.admit_due([schedule_of("sc.tick", every=1), NIGHTLY])
    edited = supervisors.start(each_backend, app=str(TESTS / "apps" / "schedules_removed_app.py"), concurrency=2)
    wait_until(lambda: [r.name for r in each_ledger.schedules.list()] == ["sc.nightly"], 30,
               message="sc.tick's schedule forgotten")
    listed = cli(each_backend, "schedules", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [record["name"] for record in json.loads(listed.stdout)] == ["sc.nightly"]
    assert ticks(each_ledger) == [] and not admissions(edited)
