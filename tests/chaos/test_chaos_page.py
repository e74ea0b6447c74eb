"""The chaos report as a page: the timeline the checker keeps for it, the page drawn from a
report, the command that draws an existing report, and the page as Chromium renders it.

The ledgers are hand-made as in `test_chaos` (the real API on a fake clock, a fleet journal and a
fault journal beside it), checked by the real checker; the short real run that writes a page is
`test_chaos.test_a_short_chaos_run_loses_nothing`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from browser import chromium, needs_chromium
from test_chaos import fault, sound_history, takeover

from supervisor.chaos import ChaosConfig
from supervisor.chaos.clocks import Clocks
from supervisor.chaos.evidence import SupervisorLife
from supervisor.chaos.page import render, write_page
from supervisor.chaos.timeline import MAX_FAULTS, MAX_TAKEN_OVER, MAX_VIOLATED, SAMPLE, TimelineBuilder
from supervisor.chaos.checker import Violation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTILE = "e<script>alert(\"&x\")</script>'"


def report_of(result, **more) -> dict:
    """A report as `build_report` makes it, from what matters to the page."""
    return {"yieldstar_chaos_report": 1, "ok": result.ok, "config": ChaosConfig(seed=7, duration_s=10).as_dict(),
            "check": result.as_dict(), "timeline": result.timeline, **more}


@pytest.mark.timeout(60)
def test_the_timeline_keeps_a_takeovers_deliveries_and_the_fault_that_caused_it(chaos_ledger):
    fault(chaos_ledger, "freeze_supervisor", 1_000_800, seconds=2.5)
    result = takeover(chaos_ledger)
    assert result.violations == []
    timeline = result.timeline
    (frozen,) = timeline["faults"]
    assert (frozen["kind"], frozen["ms"], frozen["sup"]) == ("freeze_supervisor", 2500, 1)
    (e1,) = [e for e in timeline["executions"] if e["id"] == "e1"]
    first, second = e1["deliveries"]
    assert (first["t"], first["end"], first["reason"]) == (1, "superseded", "holder_frozen")
    assert first["cause"] == frozen["i"]
    assert first["renewed"] == first["from"]  # claimed, never renewed
    assert (second["t"], second["end"], second["worker"]) == (2, "acknowledged", 4243)
    assert e1["why"] == "takeover" and e1["status"] == "completed"
    assert timeline["execution_counts"] == {"total": 1, "with_takeovers": 1, "with_violations": 0, "shown": 1,
                                            "left_out": 0}
    assert [s["n"] for s in timeline["supervisors"]] == [1]


@pytest.mark.timeout(60)
def test_the_page_draws_the_faults_and_a_takeovers_deliveries_with_their_tokens(chaos_ledger):
    fault(chaos_ledger, "freeze_supervisor", 1_000_800, seconds=2.5)
    fault(chaos_ledger, "kill_child", 1_003_000, worker_pid=4243)
    page = render(report_of(takeover(chaos_ledger)))
    assert page.startswith("<!doctype html>") and '<span class="verdict pass">PASS</span>' in page
    # The faults in the host lanes, each with its id, its kind and a title that says what it was.
    freeze = re.search(r'<g class="fault freeze_supervisor" id="f0"><title>([^<]*)</title>', page)
    assert freeze and "freeze_supervisor at" in freeze.group(1) and "for 2500 ms" in freeze.group(1)
    assert '<g class="fault kill_child" id="f1">' in page
    # The execution's deliveries, token by token, and the takeover's cause linked to its mark.
    assert '<g class="delivery superseded" data-token="1">' in page
    assert '<g class="delivery acknowledged" data-token="2">' in page
    assert '<a href="#f0"><g class="cause">' in page
    assert "1: holder_frozen" in page
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r'(src|href)="(https?:)?//', page) and "@import" not in page and "url(" not in page


@pytest.mark.timeout(60)
def test_a_report_with_a_violation_shows_it(chaos_ledger):
    result = takeover(chaos_ledger)  # no fault explains the takeover
    page = render(report_of(result))
    assert '<span class="verdict fail">FAIL</span>' in page
    assert "<td>superseded_while_alive</td><td>e1</td>" in page
    assert '<g class="execution violated">' in page and "violated: superseded_while_alive" in page
    assert "1 named by a violation" in page


@pytest.mark.timeout(60)
def test_hostile_execution_ids_are_escaped(chaos_ledger):
    sound_history(chaos_ledger, HOSTILE)
    from test_chaos import fleet

    fleet(chaos_ledger, (1, os.getpid(), 0))
    result = chaos_ledger.check()
    assert [v.execution_id for v in result.violations] == [HOSTILE]  # named by the violation, so drawn
    page = render(report_of(result, work_folder="</pre><b>folder</b>"))
    assert "<script>alert" not in page and "</pre><b>" not in page
    assert "e&lt;script&gt;alert(&quot;&amp;x&quot;)&lt;/script&gt;&#x27;" in page
    assert page.count("<script>") == 1  # the page's own


def long_run_timeline(executions: int, faults: int) -> dict:
    """The timeline of a made-up run far longer than any test can run: `executions`, each with
    a delivery taken over by a live holder (a violation each, as the checker caps them), and
    `faults` faults on 30 supervisors."""
    lives = {1000 + n: [SupervisorLife(n, 1000 + n, n * 20_000, ended_ms=n * 20_000 + 60_000, how="killed")]
             for n in range(1, 31)}
    history, rows, reasons, violations = {}, {}, {}, []
    for i in range(executions):
        eid, holder = f"e{i:06d}", f"h:{1000 + i % 30 + 1}"
        at = (i % 30 + 1) * 20_000 + i % 40_000
        history[eid] = [(eid, 1, holder, at, at + 1500, at + 1500, "superseded", None),
                        (eid, 2, holder, at + 1600, at + 3100, at + 2000, "acknowledged", "completed")]
        rows[eid] = (eid, "chaos.mixed", "{}", "completed", 2, None, None, None, 0, None)
        reasons[(eid, 1)] = None
        if len(violations) < 25:
            violations.append(Violation("superseded_while_alive", eid, "token 1 lost its lease " * 8))
    journal = [{"kind": "freeze_supervisor" if n % 2 else "kill_child", "at_s": n * 0.6, "at_ms": 20_000 + n * 600,
                "target": {"supervisor": n % 30 + 1, "worker_pid": 5000 + n}, "step": None,
                "params": {"seconds": 2.0}} for n in range(faults)]
    step_pids = {(f"e{i:06d}", 2): {4000 + i % 120} for i in range(executions)}
    return TimelineBuilder(history=history, executions=rows, clocks=Clocks(lives), faults=journal, lock_holds={},
                           step_pids=step_pids, reasons=reasons, violations=violations, lease_ms=1500).build()


@pytest.mark.timeout(120)
def test_the_page_of_a_long_run_stays_bounded():
    timeline = long_run_timeline(executions=20_000, faults=MAX_FAULTS + 1_000)
    assert len(timeline["executions"]) <= MAX_VIOLATED + MAX_TAKEN_OVER + SAMPLE
    assert timeline["execution_counts"]["total"] == 20_000
    assert len(timeline["faults"]) == MAX_FAULTS and timeline["faults_left_out"] == 1_000
    report = {"yieldstar_chaos_report": 1, "ok": False, "check": {"executions": {"admitted": 20_000}},
              "timeline": timeline}
    page = render(report)
    assert len(json.dumps(timeline)) < 2_000_000
    assert len(page.encode()) < 4_000_000, len(page)
    assert f"{len(timeline['executions'])} of 20000 executions shown" in page
    assert "1000 later faults not drawn" in page


@pytest.mark.timeout(60)
def test_a_report_written_before_reports_kept_a_timeline_still_renders():
    with open(os.path.join(ROOT, "docs", "chaos-report.json")) as f:
        report = json.load(f)
    executions = report["check"]["executions"]["admitted"]
    report.pop("timeline", None)
    page = render(report)
    assert "RESULT: PASS: 0 violations, 0 executions not terminal" in page
    assert f"<b>{executions}</b>executions" in page
    assert "This report has no timeline" in page and "--folder" in page


def page_command(*args: str):
    return subprocess.run([sys.executable, "-m", "supervisor.chaos.page", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.timeout(120)
def test_the_page_command_draws_an_existing_report_and_names_a_bad_one_in_one_line(chaos_ledger, tmp_path):
    fault(chaos_ledger, "freeze_supervisor", 1_000_800, seconds=2.5)
    result = takeover(chaos_ledger)
    report = report_of(result, work_folder=chaos_ledger.folder)
    del report["timeline"]  # as an older report: the folder gives it back
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    done = page_command(str(path), "--folder", chaos_ledger.folder)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "report.html").read_text()
    assert '<g class="delivery superseded" data-token="1">' in page and '<a href="#f0">' in page
    assert done.stdout.startswith(f"page     {tmp_path / 'report.html'}")
    (tmp_path / "not-a-report.json").write_text('{"ok": true}')
    for bad, said in (("not-a-report.json", "is not a yieldstar chaos report"), ("missing.json", "cannot read"),
                      ("report.html", "is not JSON")):
        done = page_command(str(tmp_path / bad), "-o", str(tmp_path / "bad.html"))
        assert done.returncode == 2
        assert said in done.stderr and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
        assert not (tmp_path / "bad.html").exists()


@needs_chromium
@pytest.mark.timeout(240)
def test_chromium_renders_the_page_from_a_file(chaos_ledger, tmp_path):
    fault(chaos_ledger, "freeze_supervisor", 1_000_800, seconds=2.5)
    path = tmp_path / "page" / "report.html"
    write_page(report_of(takeover(chaos_ledger)), str(path))
    dom = chromium(tmp_path, "--dump-dom", path.as_uri())
    # The script ran (the button's label is its), and both drawings are in the DOM it built.
    assert '<button id="fit-lanes" type="button">fit to window</button>' in dom
    assert '<svg class="lanes hosts" id="host-lanes"' in dom and '<svg class="lanes executions"' in dom
    assert '<g class="delivery superseded" data-token="1">' in dom
    # Screenshots compress: a blank page's is a few KB, a drawn one's many times that.
    shots = {}
    for name, url in (("page", path.as_uri()), ("blank", "about:blank")):
        shots[name] = tmp_path / f"{name}.png"
        chromium(tmp_path, f"--screenshot={shots[name]}", "--window-size=1200,900", url)
        assert shots[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sizes = {name: shot.stat().st_size for name, shot in shots.items()}
    assert sizes["page"] > 8 * sizes["blank"], sizes


@pytest.mark.timeout(60)
def test_each_host_gets_its_lanes_and_a_cut_off_host_its_band():
    """(`--hosts`) supervisors grouped by host, a partition drawn over its host's lanes, a server
    restart on the ledger's row."""
    lives = {2000 + n: [SupervisorLife(n, 2000 + n, 1_000 + n, host=n % 2)] for n in (1, 2, 3)}
    journal = [{"kind": "partition", "at_s": 1.0, "at_ms": 5_000, "target": {"host": 1, "supervisors": [1, 3]},
                "step": None, "params": {"seconds": 2.0, "healed_ms": 7_100}},
               {"kind": "server_restart", "at_s": 2.0, "at_ms": 9_000, "target": {"server": "the run's own"},
                "step": None, "params": {"began_ms": 9_000, "stopped_ms": 9_300, "started_ms": 9_900}}]
    timeline = TimelineBuilder(history={}, executions={}, clocks=Clocks(lives), faults=journal, lock_holds={},
                               step_pids={}, reasons={}, violations=[], lease_ms=1500).build()
    partition, restart = timeline["faults"]
    assert (partition["at"], partition["ms"], partition["sups"]) == (5_000 - 1_001, 2_100, [1, 3])
    assert (restart["at"], restart["ms"]) == (9_000 - 1_001, 900)
    page = render({"yieldstar_chaos_report": 1, "ok": True, "check": {}, "timeline": timeline})
    hosts = page[page.index('<svg class="lanes hosts"'):page.index("</svg>")]
    assert hosts.index(">host 0</text>") < hosts.index(">host 1</text>")
    assert hosts.count('<g class="fault partition" id="f0"><title>partition at 4.0 s for 2100 ms') == 1
    assert hosts.index('<g class="fault partition"') > hosts.index(">host 1</text>")  # over host 1's lanes
    assert '<g class="fault server_restart" id="f1">' in hosts and ">ledger</text>" in hosts


@pytest.mark.timeout(60)
def test_leases_that_overlap_are_drawn_apart_and_outlined(chaos_ledger):
    sound_history(chaos_ledger)
    # Token 2 claimed while token 1's lease was still live, as in test_chaos.
    chaos_ledger.sql("UPDATE lease_history SET claimed_at = (SELECT claimed_at + 500 FROM lease_history"
                     " WHERE execution_id = 'e1' AND token = 1) WHERE execution_id = 'e1' AND token = 2")
    result = chaos_ledger.check()
    assert "lease_overlap" in result.violation_counts
    (e1,) = result.timeline["executions"]
    assert "reason" not in e1["deliveries"][0]  # no fleet journal: the takeovers were not checked
    page = render(report_of(result))
    assert '<g class="delivery superseded" data-token="1">' in page
    assert '<g class="delivery acknowledged overlapping" data-token="2">' in page
