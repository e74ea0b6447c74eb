"""The operator's views as real commands on a real ledger file: `ls` and its filters, `get` with
what an execution waits for, `history`, `wake --at`, `stats` and `metrics`; and the time
formatting and parsing they share (`supervisor.humane`).

The ledger is set up through the public API with known times and states, relative to the wall
clock (the commands read the ledger as of now), with margins of minutes so that the seconds
a test takes change nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from faults import ROOT, wait_until

from supervisor import Completed, ExecutionRecord, Failed, Suspended, open_backend
from supervisor.cli.show import describe_wait
from supervisor.humane import (
    format_duration,
    format_time,
    parse_duration,
    parse_time,
    relative,
)
from supervisor.metrics import exposition
from supervisor.ledger.values import LedgerStats, WaitReason

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
TRACEBACK = 'Traceback (most recent call last):\n  File "shop.py", line 9, in charge\nValueError: card "declined"\n'
KOLKATA = "Asia/Kolkata"  # +05:30 all year: an offset no test machine has by accident


def yieldstar(db, *args: str, tz: str | None = None) -> subprocess.CompletedProcess:
    """One command as a subprocess, optionally in another local time zone."""
    env = {**os.environ, "TZ": tz} if tz else None
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", str(db), *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL, cwd=ROOT, env=env, check=False)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess, *phrases: str) -> None:
    """Bad input: exit 2, one line on stderr in the house style, nothing on stdout."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("yieldstar: "), result.stderr
    for phrase in phrases:
        assert phrase in lines[0]


def record_keys() -> set[str]:
    return {f.name.removesuffix("_json") for f in dataclasses.fields(ExecutionRecord)}


# -- a ledger whose every count is known --------------------------------------------------------

# (execution id, workflow, created this long ago, what happens to it), oldest first.
SHOP = [
    ("order-old", "order", 3 * DAY, "completed"),
    ("order-mid", "order", 2 * HOUR, "failed"),
    ("mail-run", "mail", 30 * MIN, "running"),
    ("mail-flaky", "mail", 20 * MIN, "released"),
    ("order-new", "order", 1 * MIN, "cancelled"),
    ("order-wait", "order", 25 * MIN, "admitted"),  # admitted last: nothing else claims it
]
NEWEST_FIRST = ["order-new", "mail-flaky", "order-wait", "mail-run", "order-mid", "order-old"]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def shop(request, tmp_path_factory):
    """The ledger of `SHOP`, on each backend: one execution at a time is admitted and given its
    state, so each claim takes the one just admitted. `mail-run` holds a 10-minute lease of this
    process."""
    if request.param == "sqlite":
        db = tmp_path_factory.mktemp("shop") / "ledger.db"
    else:
        db = request.getfixturevalue("pg_cluster").new_database()
    with open_backend(db) as backend:
        now = backend.clock()
        for execution_id, workflow, age, fate in SHOP:
            backend.executions.admit(execution_id, workflow, json.dumps({"id": execution_id}), now=now - age)
            if fate in ("completed", "failed", "running", "released"):
                (lease,) = backend.executions.claim_due(limit=1, duration=10 * MIN)
                assert lease.execution_id == execution_id
            if fate == "completed":
                backend.executions.acknowledge(lease, Completed('{"charged": true}'))
            elif fate == "failed":
                error = {"type": "ValueError", "message": 'card "declined"', "traceback": TRACEBACK}
                backend.executions.acknowledge(lease, Failed(json.dumps(error)))
            elif fate == "released":
                backend.executions.release(lease)
            elif fate == "cancelled":
                backend.executions.cancel(execution_id, reason="customer called")
    return db


def listed(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


# -- ls -----------------------------------------------------------------------------------------

def test_ls_prints_a_header_and_aligned_rows_newest_first_with_human_times(shop):
    out = ok(yieldstar(shop, "ls", tz=KOLKATA))
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "WORKFLOW", "STATUS", "TOKEN", "UNACKED", "CREATED", "UPDATED", "QUEUE", "KEY",
                              "PRIORITY"]
    assert listed(out) == NEWEST_FIRST
    for column in ("WORKFLOW", "STATUS", "CREATED", "UPDATED", "QUEUE", "KEY"):  # every row's cell starts under its heading
        at = header.index(column)
        assert all(row[at - 2:at] == "  " and row[at] != " " for row in rows), (column, out)
    old = next(row for row in rows if row.startswith("order-old"))
    assert re.search(r"  order  +completed +1 +0  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30 \(3 d ago\)", old), old
    assert re.search(r"^mail-flaky +mail +admitted +1 +1 ", next(r for r in rows if r.startswith("mail-flaky")))


def test_ls_filters_by_workflow_status_and_id_prefix(shop):
    assert listed(ok(yieldstar(shop, "ls", "--workflow", "mail"))) == ["mail-flaky", "mail-run"]
    assert listed(ok(yieldstar(shop, "ls", "--status", "admitted"))) == ["mail-flaky", "order-wait"]
    assert listed(ok(yieldstar(shop, "ls", "--status", "cancelled"))) == ["order-new"]
    assert listed(ok(yieldstar(shop, "ls", "--status", "running"))) == ["mail-run"]
    assert listed(ok(yieldstar(shop, "ls", "--workflow", "order", "--status", "admitted"))) == ["order-wait"]
    assert listed(ok(yieldstar(shop, "ls", "--id-prefix", "order-m"))) == ["order-mid"]
    (header,) = ok(yieldstar(shop, "ls", "--workflow", "nobody")).splitlines()  # no match: the header alone
    assert header.split() == ["ID", "WORKFLOW", "STATUS", "TOKEN", "UNACKED", "CREATED", "UPDATED", "QUEUE", "KEY",
                              "PRIORITY"]


def test_ls_since_and_until_take_durations_iso_times_and_epoch_ms(shop):
    assert listed(ok(yieldstar(shop, "ls", "--since", "1h"))) == ["order-new", "mail-flaky", "order-wait", "mail-run"]
    assert listed(ok(yieldstar(shop, "ls", "--since", "1h", "--until", "22m"))) == ["order-wait", "mail-run"]
    assert listed(ok(yieldstar(shop, "ls", "--until", "1d"))) == ["order-old"]
    now = datetime.now(timezone.utc)
    with_offset = (now - timedelta(hours=2, minutes=30)).astimezone(timezone(timedelta(hours=-7))).isoformat()
    zulu = (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert listed(ok(yieldstar(shop, "ls", "--since", with_offset, "--until", zulu))) == ["order-mid"]
    # A time without an offset is local: the same wall time in Kolkata is 5 h 30 min earlier than in UTC.
    naive_kolkata = (now + timedelta(hours=5, minutes=30) - timedelta(minutes=45)).strftime("%Y-%m-%dT%H:%M:%S")
    assert listed(ok(yieldstar(shop, "ls", "--since", naive_kolkata, tz=KOLKATA))) == NEWEST_FIRST[:4]
    assert listed(ok(yieldstar(shop, "ls", "--since", naive_kolkata, tz="UTC"))) == []  # 4 h 45 min from now
    epoch_ms = str(int(time.time() * 1000) - 90 * MIN)
    assert listed(ok(yieldstar(shop, "ls", "--since", epoch_ms))) == NEWEST_FIRST[:4]


def test_ls_limit_and_offset_page_through_newest_first(shop):
    assert listed(ok(yieldstar(shop, "ls", "--limit", "2"))) == NEWEST_FIRST[:2]
    assert listed(ok(yieldstar(shop, "ls", "--limit", "2", "--offset", "1"))) == NEWEST_FIRST[1:3]
    assert listed(ok(yieldstar(shop, "ls", "--offset", "5"))) == NEWEST_FIRST[5:]
    assert listed(ok(yieldstar(shop, "ls", "--offset", "9"))) == []


def test_ls_limit_0_prints_nothing_at_all(shop):
    assert ok(yieldstar(shop, "ls", "--limit", "0")) == ""
    assert json.loads(ok(yieldstar(shop, "ls", "--limit", "0", "--json"))) == []


def test_ls_json_keeps_its_shape_and_epoch_ms(shop):
    records = json.loads(ok(yieldstar(shop, "ls", "--json", "--workflow", "order", "--since", "3h")))
    assert [r["execution_id"] for r in records] == ["order-new", "order-wait", "order-mid"]
    assert all(set(r) == record_keys() for r in records)
    assert all(isinstance(r["created_at"], int) and isinstance(r["updated_at"], int) for r in records)
    assert records[2]["error"]["traceback"] == TRACEBACK


@pytest.mark.parametrize("args, phrases", [
    (["--since", "soon"], ["--since 'soon' is not a time", "ISO-8601", "30s"]),
    (["--until", "2026-13-45"], ["--until '2026-13-45' is not a time"]),
    (["--since", "30 s"], ["--since '30 s' is not a time"]),
])
def test_ls_refuses_a_bad_time_in_one_line_and_changes_nothing(shop, db_snapshot, args, phrases):
    before = db_snapshot(shop)
    refused(yieldstar(shop, "ls", *args), *phrases)
    assert db_snapshot(shop) == before


# -- get ----------------------------------------------------------------------------------------

def fields(text: str) -> dict[str, list[str]]:
    """`get`'s text as {label: [its lines]}: a line with a blank label continues the one above."""
    out: dict[str, list[str]] = {}
    label = None
    for line in text.splitlines():
        if line[:1] != " ":
            label, value = line[:27].strip(), line[28:]
            out[label] = [value]
        else:
            out[label].append(line[28:])
    return out


def test_get_shows_a_failure_readably_and_json_values_as_json(shop):
    text = ok(yieldstar(shop, "get", "order-mid", tz=KOLKATA))
    shown = fields(text)
    assert shown["status"] == ["failed"] and shown["token"] == ["1"]
    assert shown["input"] == ['{"id": "order-mid"}']
    assert shown["result"] == ["null"] and shown["due_at"] == ["-"]
    assert shown["error"] == ['ValueError: card "declined"', *TRACEBACK.rstrip("\n").splitlines()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30 \((119 min|2 h) ago\)", shown["created_at"][0])
    assert "None" not in text and "\\n" not in text
    assert "waiting for" not in shown  # a terminal execution waits for nothing


def test_get_json_adds_waiting_for_and_served_and_keeps_every_other_key(shop):
    record = json.loads(ok(yieldstar(shop, "get", "order-wait", "--json")))
    assert set(record) == record_keys() | {"waiting_for", "served"}
    assert record["served"] is False  # no supervisor runs here
    assert record["status"] == "admitted" and isinstance(record["due_at"], int)
    assert record["waiting_for"] == [{"kind": "due", "target": None, "at": record["due_at"], "detail": None}]
    text = fields(ok(yieldstar(shop, "get", "order-wait")))
    assert re.fullmatch(r"a supervisor to claim it, due since \S+ \(2[45] min ago\)", text["waiting for"][0])

    running = json.loads(ok(yieldstar(shop, "get", "mail-run", "--json")))
    assert (running["status"], running["waiting_for"]) == ("running", [])
    assert re.fullmatch(r"\S+ \(in 9 min\)|\S+ \(in 10 min\)", fields(ok(yieldstar(shop, "get", "mail-run")))[
        "lease_expires_at"][0])

    cancelled = fields(ok(yieldstar(shop, "get", "order-new")))
    assert cancelled["error"] == ["Cancelled: customer called"]


def test_get_of_an_unknown_execution_exits_1(shop):
    result = yieldstar(shop, "get", "nobody")
    assert result.returncode == 1 and result.stderr.startswith("yieldstar: ") and "nobody" in result.stderr


@pytest.mark.timeout(60)
def test_get_shows_the_timer_a_supervised_execution_sleeps_on(each_backend, tmp_path, supervisors):
    db = each_backend
    with open_backend(db) as backend:
        backend.executions.admit("napper", "sv.nap", json.dumps({"seconds": 60, "log": str(tmp_path / "log")}))
    supervisors.start(db, concurrency=1)
    record = wait_until(lambda: (r := json.loads(ok(yieldstar(db, "get", "napper", "--json"))))["status"] == "suspended"
                        and r, message="napper to sleep on its timer")
    assert record["waiting_for"] == [{"kind": "timer", "target": "nap", "at": record["due_at"], "detail": None}]
    assert record["due_at"] - record["updated_at"] in range(59_000, 60_001)
    text = fields(ok(yieldstar(db, "get", "napper", tz=KOLKATA)))
    assert re.fullmatch(r'timer "nap" until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30 \(in (5\d|60) s\)',
                        text["waiting for"][0]), text
    assert format_time(record["due_at"]) in fields(ok(yieldstar(db, "get", "napper")))["due_at"][0]


def test_every_kind_of_wait_reads_as_a_phrase():
    now = 1_800_000_000_000
    at = format_time(now + 4000, now=now)
    assert describe_wait(WaitReason("timer", "nap", now + 4000), now) == f'timer "nap" until {at}'
    assert describe_wait(WaitReason("retry", "charge", now + 4000, "Timeout: slow"), now) == (
        f'retry of step "charge" at {at}, after Timeout: slow')
    assert describe_wait(WaitReason("redelivery", None, now + 4000, "3 deliveries in a row went unacknowledged"),
                         now) == f"redelivery backoff until {at} (3 deliveries in a row went unacknowledged)"
    assert describe_wait(WaitReason("execution", "child-1"), now) == 'execution "child-1" to finish'
    assert describe_wait(WaitReason("effect", "pay-42"), now) == 'effect "pay-42" to be settled'
    assert describe_wait(WaitReason("store", "inbox", None, '{"to": "ann"}'), now) == (
        'a change to store "inbox" matching {"to": "ann"}')
    assert describe_wait(WaitReason("wake", None, now + 4000), now) == f"a wake requested for {at}"
    assert describe_wait(WaitReason("wake"), now) == "nothing: not due until something wakes it"
    assert describe_wait(WaitReason("due", None, now - 4000), now).endswith("(4 s ago)")


# -- history and wake ---------------------------------------------------------------------------

def test_history_shows_human_times(shop):
    (row,) = ok(yieldstar(shop, "history", "order-mid", tz=KOLKATA)).splitlines()
    assert re.fullmatch(r"token=1  holder=\S+:\d+  claimed_at=\S+\+05:30 \((\d+ (s|min) ago|now)\)  expires_at=\S+ \(.+\)"
                        r"  renewals=0  ended=acknowledged  outcome=failed", row), row
    (lease,) = json.loads(ok(yieldstar(shop, "history", "order-mid", "--json")))
    assert isinstance(lease["claimed_at"], int)


def test_wake_at_takes_a_duration_from_now_an_iso_time_or_epoch_ms(each_backend, tmp_path, db_snapshot):
    db = each_backend
    with open_backend(db) as backend:
        backend.executions.admit("idle", "order")
        (lease,) = backend.executions.claim_due(limit=1, duration=MIN)
        backend.executions.acknowledge(lease, Suspended())  # due at no time: it waits for a wake

        def due() -> int:
            return backend.executions.get("idle").due_at

        assert due() is None
        before = int(time.time() * 1000)
        ok(yieldstar(db, "wake", "idle", "--at", "10m"))
        assert before + 10 * MIN <= due() <= int(time.time() * 1000) + 10 * MIN
        in_5_min = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=5)
        ok(yieldstar(db, "wake", "idle", "--at", in_5_min.astimezone(timezone(timedelta(hours=2))).isoformat()))
        assert due() == int(in_5_min.timestamp() * 1000)
        epoch_ms = int(time.time() * 1000) + 2 * MIN
        ok(yieldstar(db, "wake", "idle", "--at", str(epoch_ms)))
        assert due() == epoch_ms
        snapshot = db_snapshot(db)
        refused(yieldstar(db, "wake", "idle", "--at", "later"), "--at 'later' is not a time", "from now")
        assert db_snapshot(db) == snapshot


# -- stats and metrics --------------------------------------------------------------------------

def test_stats_json_counts_what_the_ledger_holds(shop):
    summary = json.loads(ok(yieldstar(shop, "stats", "--json")))
    assert summary["by_status"] == {"admitted": 2, "running": 1, "suspended": 0, "completed": 1, "failed": 1,
                                    "cancelled": 1}
    assert summary["by_workflow"] == {"mail": {"admitted": 1, "running": 1},
                                      "order": {"admitted": 1, "cancelled": 1, "completed": 1, "failed": 1}}
    assert summary["oldest_due"]["execution_id"] == "order-wait"
    assert 25 * MIN <= summary["oldest_due"]["waited_ms"] < 26 * MIN
    assert [r["execution_id"] for r in summary["unacknowledged"]] == ["mail-flaky"]
    assert summary["unacknowledged"][0]["unacknowledged_deliveries"] == 1
    (lease,) = summary["live_leases"]
    assert (lease["execution_id"], lease["token"], lease["holder"].rsplit(":", 1)[1]) == ("mail-run", 1, str(os.getpid()))
    assert summary["deliveries"] == 4


def test_stats_text_names_the_oldest_due_and_the_failing_executions(shop):
    text = ok(yieldstar(shop, "stats"))
    lines = text.splitlines()
    assert lines[0].split() == ["executions", "6"]
    assert [line.split() for line in lines[1:7]] == [["admitted", "2"], ["running", "1"], ["suspended", "0"],
                                                    ["completed", "1"], ["failed", "1"], ["cancelled", "1"]]
    assert re.search(r"^  mail +admitted 1, running 1$", text, re.MULTILINE)
    assert re.search(r"^  order +admitted 1, cancelled 1, completed 1, failed 1$", text, re.MULTILINE)
    assert re.search(r"^oldest due +order-wait \(order\), waiting 2[56] min \(due since \S+\)$", text, re.MULTILINE)
    assert re.search(r"^unacknowledged +mail-flaky \(mail, admitted\): 1 delivery in a row$", text, re.MULTILINE)
    assert re.search(r"^live leases +1$", text, re.MULTILINE) and re.search(r"^deliveries +4$", text, re.MULTILINE)


# The text exposition format, line by line: comments, and samples `name{labels} value`.
METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\\\|\\"|\\n)*"'
SAMPLE = re.compile(rf"({METRIC_NAME})(?:\{{((?:[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE})"
                    rf"(?:,[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE})*)?\}})? (\S+)(?: -?\d+)?")
HELP = re.compile(rf"# HELP ({METRIC_NAME}) (?:[^\\\n]|\\\\|\\n)*")
TYPE = re.compile(rf"# TYPE ({METRIC_NAME}) (counter|gauge|histogram|summary|untyped)")


def parse_exposition(text: str) -> dict[tuple[str, tuple], float]:
    """Check `text` against the format and return {(name, sorted labels): value}. Each family
    has one HELP and one TYPE, before its samples, which are contiguous."""
    assert text.endswith("\n") and "\n\n" not in text
    samples: dict[tuple[str, tuple], float] = {}
    typed: dict[str, str] = {}
    helped: set[str] = set()
    finished: set[str] = set()
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            if match := TYPE.fullmatch(line):
                assert match[1] not in typed, f"two TYPE lines for {match[1]}"
                typed[match[1]] = match[2]
            elif match := HELP.fullmatch(line):
                assert match[1] not in helped, f"two HELP lines for {match[1]}"
                helped.add(match[1])
            else:
                raise AssertionError(f"not a HELP or TYPE comment: {line!r}")
            if current is not None and match[1] != current:
                finished.add(current)
            current = match[1]
            continue
        match = SAMPLE.fullmatch(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match[1], match[2], match[3]
        assert name in typed and name in helped, f"{name} sampled before its HELP and TYPE"
        assert name == current and name not in finished, f"the samples of {name} are not together"
        pairs = tuple(sorted(re.findall(rf"([a-zA-Z_][a-zA-Z0-9_]*)=({LABEL_VALUE})", labels or "")))
        key = (name, tuple((k, json.loads(v.replace("\\n", "\n").replace("\n", "\\n"))) for k, v in pairs))
        assert key not in samples, f"a repeated sample {key}"
        samples[key] = float(value)  # also accepts NaN, +Inf: the format's floats
    if "counter" in typed.values():
        assert all(name.endswith("_total") for name, kind in typed.items() if kind == "counter")
    return samples


def test_metrics_are_the_stats_in_the_prometheus_text_format(shop):
    samples = parse_exposition(ok(yieldstar(shop, "metrics")))
    by = {(name, labels): value for (name, labels), value in samples.items()}
    assert by[("yieldstar_executions", (("status", "completed"), ("workflow", "order")))] == 1
    assert by[("yieldstar_executions", (("status", "running"), ("workflow", "mail")))] == 1
    assert sum(v for (name, _), v in by.items() if name == "yieldstar_executions") == 6
    assert {labels[0][1]: v for (name, labels), v in by.items() if name == "yieldstar_executions_by_status"} == {
        "admitted": 2, "running": 1, "suspended": 0, "completed": 1, "failed": 1, "cancelled": 1}
    assert by[("yieldstar_live_leases", ())] == 1
    assert by[("yieldstar_deliveries_total", ())] == 4
    assert by[("yieldstar_unacknowledged_executions", ())] == 1
    assert by[("yieldstar_unacknowledged_deliveries_max", ())] == 1
    assert 25 * 60 <= by[("yieldstar_oldest_due_seconds", ())] < 26 * 60


def test_metrics_escape_label_values_as_the_format_says():
    weird = 'ship "fast"\\now\nplease'
    stats = LedgerStats(now=0, by_status={"admitted": 1}, by_workflow={weird: {"admitted": 1}}, oldest_due=None,
                        unacknowledged=[], live_leases=[], deliveries=0)
    text = exposition(stats, unacknowledged=0)
    assert 'workflow="ship \\"fast\\"\\\\now\\nplease"' in text
    samples = parse_exposition(text)
    assert samples[("yieldstar_oldest_due_seconds", ())] == 0


def test_stats_and_metrics_of_an_empty_ledger(each_backend, tmp_path):
    db = each_backend
    open_backend(db).close()
    assert re.search(r"^oldest due +none$", ok(yieldstar(db, "stats")), re.MULTILINE)
    samples = parse_exposition(ok(yieldstar(db, "metrics")))
    assert not any(name == "yieldstar_executions" for name, _ in samples)
    assert samples[("yieldstar_oldest_due_seconds", ())] == 0


def test_views_never_create_a_ledger(tmp_path):
    missing = tmp_path / "nothing.db"
    for command in (["ls"], ["stats"], ["metrics"], ["top"]):
        refused(yieldstar(missing, *command), "no ledger")
    assert not missing.exists()


# -- humane: formatting and parsing -------------------------------------------------------------

def test_format_time_is_iso_8601_to_the_second_with_offset_and_a_relative_hint():
    utc, plus_one = timezone.utc, timezone(timedelta(hours=1))
    assert format_time(0, tz=utc) == "1970-01-01T00:00:00+00:00"
    assert format_time(1_796_240_403_999, tz=plus_one) == "2026-12-02T20:40:03+01:00"
    now = 1_796_240_403_000
    assert format_time(now - 3 * MIN, now=now, tz=utc) == "2026-12-02T19:37:03+00:00 (3 min ago)"
    assert format_time(now + 2000, now=now, tz=utc) == "2026-12-02T19:40:05+00:00 (in 2 s)"
    assert format_time(None, now=now) == "-"
    assert relative(now + 400, now) == "now" and relative(now - 999, now) == "now"


@pytest.mark.parametrize("ms, text", [(0, "0 ms"), (850, "850 ms"), (1000, "1 s"), (90_000, "90 s"),
                                      (2 * MIN, "2 min"), (119 * MIN, "119 min"), (2 * HOUR, "2 h"),
                                      (47 * HOUR, "47 h"), (3 * DAY + 5 * HOUR, "3 d")])
def test_format_duration_uses_the_largest_unit_with_at_least_two(ms, text):
    assert format_duration(ms) == text


def test_parse_time_reads_iso_durations_and_epoch_ms():
    now = 1_796_240_403_000
    assert parse_time("2026-12-02T19:40:03+00:00", now=0) == now
    assert parse_time("2026-12-02T19:40:03Z", now=0) == now
    assert parse_time("2026-12-02T20:40:03.250+01:00", now=0) == now + 250
    assert parse_time("2026-12-02 19:40:03", now=0) == int(datetime(2026, 12, 2, 19, 40, 3).astimezone().timestamp()
                                                           * 1000)
    assert parse_time("2026-12-02", now=0) == int(datetime(2026, 12, 2).astimezone().timestamp() * 1000)
    assert parse_time("15m", now=now) == now - 15 * MIN
    assert parse_time("15m", now=now, future=True) == now + 15 * MIN
    assert parse_time("1h30m", now=now) == now - 90 * MIN
    assert parse_time(str(now), now=0) == now and parse_time(" 123 ", now=0) == 123
    assert parse_duration("2H") == 2 * HOUR


@pytest.mark.parametrize("text", ["", "soon", "yesterday", "2026-02-30", "12:00:00x", "30 s", "1.5", "3 d ago"])
def test_parse_time_refuses_anything_else_naming_the_option_and_the_text(text):
    with pytest.raises(ValueError) as refused_:
        parse_time(text, now=0, option="--since")
    assert str(refused_.value).startswith(f"--since {text!r} is not a time:")
    assert "\n" not in str(refused_.value)
