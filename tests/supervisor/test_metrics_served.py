"""`supervise --metrics ADDR` (SPEC section 13): a real supervisor of `tests/apps/metrics_app.py`
on a real ledger (a SQLite file, and PostgreSQL) serves /metrics over HTTP; a scrape, parsed with
prometheus_client's own text parser, counts exactly the deliveries, step attempts, claims and
outcomes the run made, and carries the ledger's `stats` gauges as `yieldstar metrics` prints
them. A bare port listens on 127.0.0.1 alone. A bad address, a port in use and a missing
prometheus_client are each one line on stderr naming `--metrics`, exit 2, no traceback, and
nothing started. Every wait polls against a deadline."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request

import psutil
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from faults import TESTS, cli, sigkill, wait_until
from supervisor import open_backend

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(120)]

APP = str(TESTS / "apps" / "metrics_app.py")
STEP_S = 0.05  # each step of mx.steps and mx.async_steps sleeps this long


def metrics_url(process) -> str:
    """The URL the supervisor's log says it serves (it was given port 0: any free one)."""
    found = re.search(r"serving metrics at (http://\S+/metrics)", process.wait_log("serving metrics at"))
    return found.group(1)


def scrape(url: str) -> dict[tuple, float]:
    """Every sample of one scrape, by (name, labels as sorted pairs)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape_until(url: str, name: str, message: str, **labels) -> dict[tuple, float]:
    """The first scrape that has a non-zero sample `name` with `labels`."""
    def found():
        samples = scrape(url)
        return samples if value(samples, name, **labels) else None
    return wait_until(found, 30, message=message)


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start(ledger, execution_id: str, workflow: str, input=None) -> None:
    ledger.executions.admit(execution_id, workflow, json.dumps(input), queue=None)


def terminal(ledger, ids) -> bool:
    return all(ledger.executions.get(e).status in ("completed", "failed") for e in ids)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers", [None, 2], ids=["a-process-per-delivery", "workers-of-several"])
def test_a_scrape_counts_the_runs_deliveries_steps_claims_and_outcomes_and_the_ledgers_gauges(
        each_backend, each_ledger, supervisors, tmp_path, workers):
    process = supervisors.start(each_backend, app=APP, concurrency=2, workers=workers, extra=["--metrics", "0"])
    url = metrics_url(process)
    # A bare port: the supervisor listens on loopback, and nowhere else.
    assert url.startswith("http://127.0.0.1:")
    listening = [c.laddr for c in psutil.Process(process.pid).net_connections("tcp") if c.status == "LISTEN"]
    assert [addr.ip for addr in listening] == ["127.0.0.1"] and url.endswith(f":{listening[0].port}/metrics")

    gate = tmp_path / "gate"
    start(each_ledger, "gated", "mx.gated", {"gate": str(gate)})
    done = [f"steps-{i}" for i in range(3)] + ["async-0", "fails-0", "fails-1"]
    for execution_id in done[:3]:
        start(each_ledger, execution_id, "mx.steps", {"steps": 2})
    start(each_ledger, "async-0", "mx.async_steps", {"steps": 3})
    start(each_ledger, "fails-0", "mx.fails")
    start(each_ledger, "fails-1", "mx.fails")
    wait_until(lambda: terminal(each_ledger, done), 60, message="every execution but the gated one ended")

    samples = scrape(url)
    delivered = {("mx.steps", "reports", "completed"): 3, ("mx.async_steps", "reports", "completed"): 1,
                 ("mx.fails", "default", "failed"): 2}
    for (workflow, queue, outcome), count in delivered.items():
        labels = dict(workflow=workflow, queue=queue, outcome=outcome)
        assert value(samples, "yieldstar_delivery_seconds_count", **labels) == count, labels
        assert value(samples, "yieldstar_delivery_seconds_bucket", le="+Inf", **labels) == count, labels
        assert value(samples, "yieldstar_outcomes_total", **labels) == count, labels
    # The deliveries with steps lasted at least their steps' sleeps.
    assert value(samples, "yieldstar_delivery_seconds_sum", workflow="mx.steps", queue="reports",
                 outcome="completed") >= 3 * 2 * STEP_S
    # Step attempts: 2 of each mx.steps, 3 of the async one, none of mx.fails; the gated one's
    # step is still running, and counts once it ends.
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.steps") == 6
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.async_steps") == 3
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.fails") == 0
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.gated") == 0
    assert 6 * STEP_S <= value(samples, "yieldstar_step_seconds_sum", workflow="mx.steps") < 6 * STEP_S + 5
    # One claim each, the gated one's included, by workflow and queue.
    claims = {("mx.steps", "reports"): 3, ("mx.async_steps", "reports"): 1, ("mx.fails", "default"): 2,
              ("mx.gated", "default"): 1}
    for (workflow, queue), count in claims.items():
        assert value(samples, "yieldstar_claim_delay_seconds_count", workflow=workflow, queue=queue) == count
    assert sum(v for (name, _), v in samples.items() if name == "yieldstar_claim_delay_seconds_sum") >= 0
    assert not any(name == "yieldstar_lost_leases_total" for name, _ in samples)
    assert not any(name == "yieldstar_storage_errors_total" for name, _ in samples)
    # The ledger's gauges, as `yieldstar metrics` prints them, read on the scrape: the gated
    # execution holds the one live lease.
    assert value(samples, "yieldstar_executions", status="completed", workflow="mx.steps") == 3
    assert value(samples, "yieldstar_executions", status="failed", workflow="mx.fails") == 2
    assert value(samples, "yieldstar_executions_by_status", status="running") == 1
    assert value(samples, "yieldstar_live_leases") == 1
    assert value(samples, "yieldstar_deliveries_total") == 7
    printed = cli(each_backend, "metrics")
    assert printed.returncode == 0, printed.stderr
    for line in printed.stdout.splitlines():
        if line.startswith(("yieldstar_executions", "yieldstar_live_leases", "yieldstar_deliveries_total")):
            name, labels_text, number = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line).groups()
            labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text or ""))
            assert value(samples, name, **labels) == float(number), line

    gate.touch()
    wait_until(lambda: terminal(each_ledger, ["gated"]), 60, message="the gated execution completed")
    samples = scrape_until(url, "yieldstar_delivery_seconds_count", "the gated delivery in a scrape",
                           workflow="mx.gated", queue="default", outcome="completed")
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.gated") == 1
    assert value(samples, "yieldstar_live_leases") == 0
    assert value(samples, "yieldstar_executions_by_status", status="completed") == 5


def test_a_lost_lease_and_a_worker_killed_mid_delivery_are_counted(sqlite_path, sqlite_ledger, supervisors, tmp_path):
    """An operator cancels a running execution: its delivery ends in the ledger, the supervisor
    stops it, and the scrape counts one lost lease and one delivery that ended `lost`. Then a
    worker is SIGKILLed mid-delivery: one delivery that ended `crashed` (its lease left to expire)."""
    process = supervisors.start(sqlite_path, app=APP, concurrency=1, extra=["--metrics", "0"])
    url = metrics_url(process)
    start(sqlite_ledger, "cancelled", "mx.gated", {"gate": str(tmp_path / "never")})
    wait_until(lambda: sqlite_ledger.executions.get("cancelled").status == "running", 30,
               message="the gated execution running")
    assert cli(sqlite_path, "cancel", "cancelled").returncode == 0
    samples = scrape_until(url, "yieldstar_lost_leases_total", "a lost lease in a scrape", workflow="mx.gated",
                           queue="default")
    assert value(samples, "yieldstar_lost_leases_total", workflow="mx.gated", queue="default") == 1
    assert value(samples, "yieldstar_outcomes_total", workflow="mx.gated", queue="default", outcome="lost") == 1
    assert value(samples, "yieldstar_delivery_seconds_count", workflow="mx.gated", queue="default",
                 outcome="lost") == 1

    start(sqlite_ledger, "crashed", "mx.gated", {"gate": str(tmp_path / "never")})
    wait_until(lambda: sqlite_ledger.executions.get("crashed").status == "running", 30,
               message="the second gated execution running")
    (worker_pid,) = process.wait_ready()
    sigkill(worker_pid)
    samples = scrape_until(url, "yieldstar_outcomes_total", "a crashed delivery in a scrape", workflow="mx.gated",
                           queue="default", outcome="crashed")
    assert value(samples, "yieldstar_outcomes_total", workflow="mx.gated", queue="default", outcome="crashed") == 1
    assert value(samples, "yieldstar_lost_leases_total", workflow="mx.gated", queue="default") == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["abc", "70000", "-1", "", "localhost:", ":9464", "127.0.0.1:x", "::1:9464",
                                 "9464.5"])
def test_a_bad_metrics_address_is_refused_naming_the_option(sqlite_path, bad):
    refused = cli(sqlite_path, "supervise", APP, "--metrics", bad)
    assert refused.returncode == 2, refused
    assert "--metrics" in refused.stderr and repr(bad) in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert not sqlite_path.exists()  # nothing started, no ledger made


@pytest.mark.timeout(60)
def test_a_metrics_port_in_use_is_refused_naming_the_option_and_the_address(sqlite_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = cli(sqlite_path, "supervise", APP, "--metrics", str(port))
    assert refused.returncode == 2, refused
    assert f"--metrics: cannot listen on 127.0.0.1:{port}: Address already in use" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not sqlite_path.exists()


@pytest.mark.timeout(60)
def test_metrics_without_prometheus_client_is_an_error_that_says_what_to_install(sqlite_path):
    # `None` in sys.modules makes `import prometheus_client` fail as if it were not installed.
    code = ("import sys; sys.modules['prometheus_client'] = None; sys.argv[0] = 'yieldstar';"
            " from supervisor.cli import entry; entry()")
    refused = subprocess.run([sys.executable, "-c", code, "--db", str(sqlite_path), "supervise", APP,
                              "--metrics", "0"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2, refused
    assert "--metrics" in refused.stderr and "pip install 'yieldstar[metrics]'" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not sqlite_path.exists()


@pytest.mark.timeout(60)
def test_prometheus_client_is_imported_by_the_metrics_server_alone_never_by_a_plain_supervisor_nor_a_worker():
    code = ("import sys; import supervisor.cli, supervisor.dispatcher, worker._runtime.child,"
            " worker._runtime.deliveries, worker.apps.bench;"
            " plain = [m for m in sys.modules if m.startswith('prometheus_client')];"
            " import supervisor.metrics_server;"
            " print(len(plain), 'prometheus_client' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"]


def test_a_scrape_after_the_database_cut_its_connection_reads_the_ledgers_gauges_again(pg_uri, supervisors):
    """Every session of the supervisor's database is terminated (a server restart, as its
    sessions see it): a scrape then may lack the ledger's gauges (it logs why, and opens a
    connection again for the next), and later ones serve them, the supervisor's own metrics
    throughout."""
    process = supervisors.start(pg_uri, app=APP, concurrency=1, extra=["--metrics", "0"])
    url = metrics_url(process)
    assert value(scrape(url), "yieldstar_executions_by_status", status="admitted") == 0
    with psycopg.connect(pg_uri, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE datname = current_database() AND pid <> pg_backend_pid()")
    scrape(url)  # served (200), with or without the gauges
    with open_backend(pg_uri) as ledger:
        start(ledger, "after", "mx.steps", {"steps": 1})
        wait_until(lambda: terminal(ledger, ["after"]), 60, message="an execution run after the cut")
    samples = scrape_until(url, "yieldstar_executions", "the ledger's gauges read again", status="completed",
                           workflow="mx.steps")
    assert value(samples, "yieldstar_step_seconds_count", workflow="mx.steps") == 1
    assert value(samples, "yieldstar_delivery_seconds_count", workflow="mx.steps", queue="reports",
                 outcome="completed") == 1
