"""`yieldstar chaos --app APP`: the chaos harness on a user's own workflows. The app defines
`chaos_workload(rng, count)`; the checker applies to its executions the checks that need no
evidence of the built-in workload (leases, tokens, stale writes, terminal, no storage error)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from faults import ROOT
from supervisor.chaos import ChaosConfig, run_chaos, summary_lines
from supervisor.chaos.workload import app_workload
from supervisor.ledger.errors import InvalidArgument

SHOP = os.path.join(ROOT, "tests", "apps", "chaos_shop_app.py")


def test_an_apps_workload_is_admitted_evenly_and_seeded():
    first = app_workload(SHOP, random.Random(3), 10, 5.0)
    assert [(a.execution_id, a.workflow, a.at_s) for a in first[:2]] == [("u000000", "shop.order", 0.0),
                                                                         ("u000001", "shop.order", 0.5)]
    assert first == app_workload(SHOP, random.Random(3), 10, 5.0)
    assert len(first) == 10 and all(a.input["id"] == n for n, a in enumerate(first))


def test_an_app_without_a_workload_is_refused_with_what_it_needs(tmp_path):
    app = tmp_path / "bare_app.py"
    app.write_text("from worker import workflow\n")
    with pytest.raises(InvalidArgument, match=r"defines no chaos_workload\(rng, count\)"):
        app_workload(str(app), random.Random(1), 5, 1.0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_short_chaos_run_on_a_users_own_workflows_loses_nothing(tmp_path):
    config = ChaosConfig(seed=5, duration_s=6, supervisors=2, concurrency=2, executions=30, app=SHOP,
                         faults=("kill_child", "kill_supervisor", "freeze_supervisor"), fault_interval_s=0.8,
                         drain_timeout_s=60)
    report = run_chaos(config, folder=str(tmp_path / "chaos"), out=lambda line: None)
    check = report["check"]
    summary = "\n".join(summary_lines(report))
    assert report["ok"] and check["violations"] == [], summary
    assert check["executions"] == {**check["executions"], "admitted": 30, "completed": 30, "not_terminal": 0}
    assert check["faults"]["total"] >= 3, summary
    assert check["steps"]["records"] >= 60, summary  # reserve, settle and charge of each order


@pytest.mark.timeout(60)
def test_the_cli_names_the_app_it_cannot_find(tmp_path):
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "chaos", "--app", str(tmp_path / "nope.py"),
                           "--duration", "1", "--workdir", str(tmp_path / "chaos")],
                          capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert done.returncode != 0 and "nope.py does not exist" in done.stderr, done.stderr
