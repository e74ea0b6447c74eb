"""Routing and live supervisors with real processes (SPEC section 11): supervisors of different
apps share one ledger (a SQLite file, and PostgreSQL) and each runs only the workflows its app
registers; work nobody serves stays admitted, is not waited for by `--until-idle`, and is shown
as such by `get --json`, `start`, `stats`; `yieldstar supervisors` lists the live ones.

The apps are `tests/apps/routing_orders_app.py` (rt.order, rt.shared) and
`tests/apps/routing_reports_app.py` (rt.report, rt.shared). Every wait polls against a deadline.
"""

from __future__ import annotations

import json
import signal

import pytest

from faults import RENEW_MS, TESTS, admit, cli, sigkill, wait_gone, wait_until

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(90)]

ORDERS = str(TESTS / "apps" / "routing_orders_app.py")
REPORTS = str(TESTS / "apps" / "routing_reports_app.py")


def claimers(ledger, execution_id: str) -> set[int]:
    """The pids of the supervisors that claimed the execution (the lease history's holders)."""
    return {int(h.holder.rpartition(":")[2]) for h in ledger.executions.history(execution_id)}


def live(db) -> list[dict]:
    result = cli(db, "supervisors", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_supervisors_with_different_apps_each_run_only_their_own_workflows(
        each_backend, each_ledger, supervisors):
    for i in range(4):
        admit(each_backend, f"order-{i}", "rt.order")
        admit(each_backend, f"report-{i}", "rt.report")
        admit(each_backend, f"shared-{i}", "rt.shared")
    orders = supervisors.start(each_backend, app=ORDERS, concurrency=2)
    reports = supervisors.start(each_backend, app=REPORTS, concurrency=2)

    everything = [f"{kind}-{i}" for kind in ("order", "report", "shared") for i in range(4)]
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in everything), 45,
               message="every execution completed")

    for i in range(4):
        assert claimers(each_ledger, f"order-{i}") == {orders.pid}
        assert json.loads(each_ledger.executions.get(f"order-{i}").result_json)["app"] == "orders"
        assert claimers(each_ledger, f"report-{i}") == {reports.pid}
        assert json.loads(each_ledger.executions.get(f"report-{i}").result_json)["app"] == "reports"
        assert claimers(each_ledger, f"shared-{i}") <= {orders.pid, reports.pid}  # served by both
    for execution_id in everything:  # each delivered once: nobody claimed what it could not run
        assert [(h.token, h.ended_by) for h in each_ledger.executions.history(execution_id)] == [(1, "acknowledged")]
    assert "UnknownWorkflow" not in orders.log() + reports.log()


def test_an_app_lacking_a_workflow_leaves_its_executions_admitted_and_until_idle_does_not_wait_for_them(
        each_backend, each_ledger, supervisors):
    for i in range(3):
        admit(each_backend, f"order-{i}", "rt.order")
        admit(each_backend, f"report-{i}", "rt.report")  # due all along, and nobody here serves it

    orders = supervisors.start(each_backend, app=ORDERS, concurrency=2, until_idle=True, ready=False)

    assert orders.wait(45) == 0
    assert "idle: nothing running and nothing due" in orders.log()
    for i in range(3):
        assert each_ledger.executions.get(f"order-{i}").status == "completed"
        report = each_ledger.executions.get(f"report-{i}")
        assert (report.status, report.token, report.error_json, report.unacknowledged_deliveries) == (
            "admitted", 0, None, 0)
        assert each_ledger.executions.history(f"report-{i}") == []
    assert "serving 2 workflows: rt.order, rt.shared" in orders.log()

    # A supervisor that serves them runs them afterwards.
    reports = supervisors.start(each_backend, app=REPORTS, concurrency=2, until_idle=True, ready=False)
    assert reports.wait(45) == 0
    assert all(each_ledger.executions.get(f"report-{i}").status == "completed" for i in range(3))


def test_supervisors_lists_the_live_ones_then_not_one_that_stopped_nor_one_that_was_killed(
        each_backend, supervisors):
    orders = supervisors.start(each_backend, app=ORDERS, concurrency=2)
    reports = supervisors.start(each_backend, app=REPORTS, concurrency=3, workers=1)

    both = wait_until(lambda: (found := live(each_backend)) and len(found) == 2 and found, 20,
                      message="both supervisors listed")
    by_pid = {s["pid"]: s for s in both}
    assert set(by_pid) == {orders.pid, reports.pid}
    assert set(both[0]) >= {"id", "host", "pid", "started_at", "last_seen_at", "workflows", "concurrency", "workers"}
    assert (by_pid[orders.pid]["workflows"], by_pid[orders.pid]["concurrency"], by_pid[orders.pid]["workers"]) == (
        ["rt.order", "rt.shared"], 2, 2)
    assert (by_pid[reports.pid]["workflows"], by_pid[reports.pid]["concurrency"], by_pid[reports.pid]["workers"]) == (
        ["rt.report", "rt.shared"], 3, 1)
    assert by_pid[orders.pid]["renew_ms"] == RENEW_MS
    # Seen again at every renewal round.
    first_seen = by_pid[orders.pid]["last_seen_at"]
    wait_until(lambda: any(s["pid"] == orders.pid and s["last_seen_at"] > first_seen for s in live(each_backend)),
               10, message="last_seen_at refreshed")
    text = cli(each_backend, "supervisors")
    assert text.returncode == 0 and "rt.order, rt.shared" in text.stdout and str(reports.pid) in text.stdout

    # A clean exit removes its row at once.
    orders.signal(signal.SIGTERM)
    assert orders.wait(30) == 0
    assert [s["pid"] for s in live(each_backend)] == [reports.pid]

    # A killed one stops being live three renewal intervals after it was last seen.
    reports.kill_everything()
    wait_gone([reports.pid])
    assert wait_until(lambda: live(each_backend) == [], 10 + 3 * RENEW_MS / 1000, message="no live supervisor")
    text = cli(each_backend, "supervisors")
    assert text.returncode == 0 and text.stdout.startswith("no live supervisor")


def test_get_json_says_whether_a_live_supervisor_serves_the_workflow_and_start_notes_when_none_does(
        each_backend, each_ledger, supervisors):
    started = cli(each_backend, "start", "rt.report", "--id", "report-1")
    assert started.returncode == 0 and started.stdout == "report-1\n"
    assert "no live supervisor serves workflow 'rt.report'" in started.stderr
    assert json.loads(cli(each_backend, "get", "report-1", "--json").stdout)["served"] is False

    orders = supervisors.start(each_backend, app=ORDERS, concurrency=1)
    wait_until(lambda: live(each_backend), 20, message="the supervisor registered")

    started = cli(each_backend, "start", "rt.order", "--id", "order-1")
    assert started.returncode == 0 and started.stdout == "order-1\n" and started.stderr == ""
    wait_until(lambda: each_ledger.executions.get("order-1").status == "completed", 30, message="order-1 completed")
    assert json.loads(cli(each_backend, "get", "order-1", "--json").stdout)["served"] is True
    report = json.loads(cli(each_backend, "get", "report-1", "--json").stdout)
    assert (report["served"], report["status"], report["token"]) == (False, "admitted", 0)
    assert "served" in cli(each_backend, "get", "report-1").stdout

    stats = json.loads(cli(each_backend, "stats", "--json").stdout)
    assert stats["unserved"] == {"rt.report": {"admitted": 1}}
    text = cli(each_backend, "stats").stdout
    assert "not served" in text and "rt.report" in text.split("not served")[1]
    top = cli(each_backend, "top")
    assert top.returncode == 0 and "not served by any live supervisor: rt.report (admitted 1)" in top.stdout

    orders.signal(signal.SIGTERM)
    assert orders.wait(30) == 0
    assert json.loads(cli(each_backend, "get", "order-1", "--json").stdout)["served"] is False


# The app starts a thread when imported, so its workers are fresh interpreters that each import
# it from disk (a template's forks would all run the version the template imported).
CHANGING_APP = """
import threading

from worker import workflow

threading.Thread(target=threading.Event().wait, daemon=True).start()


@workflow("rt.order")
def order(ctx, input):
    return "order"
"""
EXTRA = """

@workflow("rt.extra")
def extra(ctx, input):
    return "extra, from the first version of the app"
"""


def test_an_app_changed_on_disk_under_a_running_supervisor_is_served_what_every_worker_runs(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    """Workers that are fresh interpreters (the app starts a thread on import) each load the app
    from disk: one replaced after the file changed may run another version than its siblings, and
    the supervisor claims only what every worker runs."""
    app = tmp_path / "changing_app.py"
    app.write_text(CHANGING_APP + EXTRA)
    supervisor = supervisors.start(sqlite_path, app=str(app), concurrency=2)
    wait_until(lambda: [s["workflows"] for s in live(sqlite_path)] == [["rt.extra", "rt.order"]], 20,
               message="registered with both workflows")

    app.write_text(CHANGING_APP)  # rt.extra is gone from the app; one worker is replaced and loads this
    old = supervisor.workers()
    sigkill(old[0])
    supervisor.wait_log("claiming only what every worker runs: [rt.order]")
    wait_until(lambda: [s["workflows"] for s in live(sqlite_path)] == [["rt.order"]], 20,
               message="registered with rt.order alone")

    admit(sqlite_path, "extra-1", "rt.extra")  # due first, and never claimed: not every worker runs it
    admit(sqlite_path, "order-1", "rt.order")
    wait_until(lambda: sqlite_ledger.executions.get("order-1").status == "completed", 20, message="order-1 completed")
    extra = sqlite_ledger.executions.get("extra-1")
    assert (extra.status, extra.token, extra.error_json) == ("admitted", 0, None)
    assert "UnknownWorkflow" not in supervisor.log()


def test_a_worker_forked_from_the_template_runs_the_app_the_supervisor_started_with(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    """Workers forked from the template run the version of the app it imported when the
    supervisor started: one replaced after the file changed on disk runs that version too, so a
    supervisor never mixes versions; a new version is deployed by restarting the supervisor."""
    app = tmp_path / "versioned_app.py"
    app.write_text(CHANGING_APP.replace("threading.Thread(target=threading.Event().wait, daemon=True).start()\n", "")
                   + EXTRA)
    supervisor = supervisors.start(sqlite_path, app=str(app), concurrency=2)
    wait_until(lambda: [s["workflows"] for s in live(sqlite_path)] == [["rt.extra", "rt.order"]], 20,
               message="registered with both workflows")
    app.write_text("raise RuntimeError('a worker loaded the changed file')\n")
    old = supervisor.workers()
    sigkill(old[0])
    wait_until(lambda: len(set(supervisor.workers()) - set(old)) == 1, 30, message="the killed worker was replaced")
    admit(sqlite_path, "extra-1", "rt.extra")
    wait_until(lambda: sqlite_ledger.executions.get("extra-1").status == "completed", 30, message="extra-1 completed")
    assert [s["workflows"] for s in live(sqlite_path)] == [["rt.extra", "rt.order"]]
    assert "changed file" not in supervisor.log() and "claiming only" not in supervisor.log()
