"""`yieldstar check APP` (SPEC section 11): the work in flight replayed against new code, on
both backends, writing nothing."""

from __future__ import annotations

import json
import textwrap

import pytest
from faults import cli

from supervisor import Suspended, open_backend
from worker._runtime.driver import run_delivery
from worker._runtime.loading import load_app

pytestmark = pytest.mark.timeout(120)

APP = """
from worker import Registry

registry = Registry()

def step(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")
    return name

@registry.workflow("order")
def order(ctx, input):
    ctx.run({first!r}, step, {first!r})
    ctx.sleep("cool-off", 3600)
    return ctx.run("ship", step, "ship")

@registry.workflow("refund")
async def refund(ctx, input):
    await ctx.run({refund!r}, step, {refund!r})
    await ctx.sleep("cool-off", 3600)
    return "refunded"
"""


def write_app(tmp_path, name: str, *, first: str, refund: str = "return-goods") -> str:
    path = tmp_path / f"{name}.py"
    log = tmp_path / "steps.log"
    path.write_text(f"LOG = {str(log)!r}\n" + textwrap.dedent(APP.format(first=first, refund=refund)))
    return str(path)


@pytest.fixture
def in_flight(each_backend, tmp_path):
    """A ledger with three orders and two refunds suspended at their timer by the old code (v1),
    and one execution of a workflow v1 does not register."""
    db = str(each_backend)
    v1 = write_app(tmp_path, "app_v1", first="reserve")
    registry = load_app(v1)
    with open_backend(db) as backend:
        for i in range(3):
            backend.executions.admit(f"order-{i}", "order", "{}")
        for i in range(2):
            backend.executions.admit(f"refund-{i}", "refund", "{}")
        backend.executions.admit("news-1", "newsletter", "{}")
        for lease in backend.executions.claim_due(limit=10, duration=60_000, workflows=["order", "refund"]):
            outcome = run_delivery(backend, lease, registry)
            assert outcome == Suspended(), outcome
            backend.executions.acknowledge(lease, outcome)
    return db, v1


def check(db, app, *args):
    return cli(db, "check", app, *args, timeout=60)


def test_check_passes_the_code_that_recorded_the_steps(in_flight, tmp_path):
    db, v1 = in_flight
    done = check(db, v1, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["checked"] == 5 and report["diverge"] == []
    assert report["workflows"] == ["order", "refund"]
    assert report["not_served"] == [{"execution_id": "news-1", "workflow": "newsletter", "status": "admitted"}]
    text = check(db, v1)
    assert text.returncode == 0
    assert "would diverge: none" in text.stdout and "not served by" in text.stdout and "newsletter 1" in text.stdout


def test_check_lists_what_new_code_would_diverge_on_and_changes_nothing(in_flight, tmp_path, db_snapshot):
    db, _ = in_flight
    v2 = write_app(tmp_path, "app_v2", first="hold", refund="return-goods")  # `reserve` renamed
    v3 = write_app(tmp_path, "app_v3", first="reserve", refund="refund-goods")  # the async one renamed
    ran_before = (tmp_path / "steps.log").read_text()
    before = db_snapshot(db)

    done = check(db, v2, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [d["execution_id"] for d in report["diverge"]] == ["order-0", "order-1", "order-2"]
    assert all("'reserve'" in d["detail"] and "'hold'" in d["detail"] for d in report["diverge"])

    done = check(db, v3)
    assert done.returncode == 1
    assert "would diverge: 2" in done.stdout and "refund-0" in done.stdout and "'refund-goods'" in done.stdout

    # No step function ran, nothing was written.
    assert (tmp_path / "steps.log").read_text() == ran_before
    assert db_snapshot(db) == before


def test_check_refuses_bad_input_with_one_line_and_exit_2(in_flight, tmp_path, db_snapshot):
    db, _ = in_flight
    before = db_snapshot(db)
    missing = check(db, str(tmp_path / "nowhere.py"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("yieldstar: ") and "nowhere.py" in missing.stderr
    broken = tmp_path / "broken_app.py"
    broken.write_text("raise RuntimeError('this app is broken')\n")
    done = check(db, str(broken))
    assert done.returncode == 2 and "this app is broken" in done.stderr and "Traceback" not in done.stderr
    no_ledger = cli(tmp_path / "none.db", "check", str(broken))
    assert no_ledger.returncode == 2 and "no ledger" in no_ledger.stderr
    assert not (tmp_path / "none.db").exists()
    assert db_snapshot(db) == before
