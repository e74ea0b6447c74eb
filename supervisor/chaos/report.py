"""The chaos report: one JSON document for machines, one screen of text for people, and a web
page drawn from the JSON (`page`).

The JSON holds the run's configuration, timings, the checker's figures and violations, what the
harness saw of its processes, and the timeline the page draws (`timeline`). The summary groups the
checker's violation kinds under the invariants the issue names, each with its count and PASS/FAIL.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import textwrap
import time
from typing import Optional

from .config import per_supervisor

# The checker's message violation kinds (`message_checks`): one invariant of the summary.
MESSAGE_KINDS = ("message_lost", "message_taken_twice", "message_mismatch", "message_order", "message_stored_twice",
                 "message_refused")
# Each invariant of the summary, and the checker's (and harness's) violation kinds that break it.
INVARIANTS = [
    ("every execution terminal (none stuck or lost)", ("not_terminal",)),
    ("no two live leases of an execution overlap", ("lease_overlap",)),
    ("tokens of an execution are 1..n, claimed in order", ("token_sequence",)),
    ("outcomes acknowledged by the current holder", ("stale_acknowledgement", "missing_acknowledgement",
                                                     "outcome_token")),
    ("step records never changed, never written stale", ("duplicate_step", "step_outside_lease", "stale_step_write",
                                                         "step_value_unexplained", "step_value_changed")),
    ("timers never fire early", ("timer_early",)),
    ("each effect executed once per effect id", ("effect_executed_twice", "effect_result_mismatch",
                                                 "effect_unsettled")),
    ("store updates applied exactly once", ("counter_mismatch", "mailbox_mismatch")),
    ("parents see their children's results", ("child_result_mismatch",)),
    ("no execution failed by an infrastructure error", ("failed_by_infrastructure",)),
    ("no lease superseded while its holder was alive", ("superseded_while_alive",)),
    ("effect and start ids: each belongs to one execution", ("effect_id_shared", "start_id_shared")),
    ("queue limits: live leases, per key, rate", ("queue_concurrency", "queue_per_key", "queue_rate")),
    ("messages: none lost, none taken twice, in order", MESSAGE_KINDS),
    ("processes: no crash, orphan or hung stop", ("supervisor_crashed", "supervisor_exit", "supervisor_hung",
                                                  "orphan_survived", "disk_full_failed",
                                                  "server_restart_failed")),
]


WIDTH = 100  # of the summary's lines


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def source_of(root: str) -> dict:
    """Which code ran: the folder, and its git commit (and whether files differ from it) if any."""
    found: dict = {"root": root}
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            found["commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            found["uncommitted_changes"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return found


def build_report(config, result, *, harness: dict, timings: dict, folder: str, db_path: str, began: float,
                 ended: float, source: Optional[dict] = None) -> dict:
    """The whole report of one run, as a JSON-ready dict."""
    return {
        "yieldstar_chaos_report": 1,
        "ok": result.ok,
        "config": config.as_dict(),
        "began": _iso(began),
        "ended": _iso(ended),
        "timings": timings,
        "host": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "source": source,
        "work_folder": folder,
        "ledger": db_path,
        "check": result.as_dict(),
        "harness": harness,
        "timeline": result.timeline,  # for the page (`timeline`, `page`)
    }


def write_report(report: dict, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")


def _get(d: dict, *keys, default=0):
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def summary_lines(report: dict) -> list[str]:
    """One screen: what ran, what was done to it, and each invariant with PASS or FAIL."""
    check = report["check"]
    lines = []
    config: Optional[dict] = report.get("config")
    if config:
        t = report.get("timings", {})
        lines.append(f"yieldstar chaos  seed {config['seed']}  {config['duration_s']:g} s of faults"
                     f" (+{t.get('drain_s', 0):g} s drain, {t.get('total_s', 0):g} s in all)")
        lines.append(f"  {config['supervisors']} supervisors x"
                     f" {per_supervisor(config['concurrency'], config.get('workers'))}, lease"
                     f" {config['lease_ms']} ms, renew {config['renew_ms']} ms, heartbeat {config['heartbeat_ms']} ms")
        lines.append(f"  work folder {report.get('work_folder')}")
        src = report.get("source") or {}
        if src.get("commit"):
            lines.append(f"  code {src['root']} at {src['commit'][:12]}"
                         + (" with uncommitted changes" if src.get("uncommitted_changes") else ""))
    e = check.get("executions", {})
    lines.append(f"executions  {e.get('admitted', 0)} ({e.get('admitted_by_harness', 0)} admitted +"
                 f" {e.get('started_by_workflows', 0)} started by workflows): {e.get('completed', 0)} completed,"
                 f" {e.get('failed', 0)} failed, {e.get('not_terminal', 0)} not terminal")
    ends = _get(check, "leases", "deliveries_by_end", default={})
    lines.append(f"deliveries  {e.get('deliveries', 0)}: " + ", ".join(f"{n} {k}" for k, n in ends.items()))
    f = check.get("faults")
    if f:
        kinds = ", ".join(f"{k} {n}" for k, n in f["by_kind"].items())
        lines.append(f"faults      {f['total']} injected, {f['inside_a_step']} inside a step: {kinds}")
    h = report.get("harness")
    if h:
        exits = ", ".join(f"{n} {k}" for k, n in sorted(h.get("supervisor_exits", {}).items()))
        lines.append(f"supervisors {h['supervisors_started']} started in all ({exits or 'none ended'})"
                     + (f"; {h['workers_killed_while_starting']} workers killed while loading the app"
                        if h.get("workers_killed_while_starting") else ""))
        if h.get("ledger_backend"):
            elsewhere = sorted(h.get("kinds_not_offered") or {})
            lines.append(f"ledger      {h['ledger_backend']} {report.get('ledger')}"
                         + (f"; not offered on it: {', '.join(elsewhere)}" if elsewhere else ""))
        if h.get("hosts"):
            lines.append(f"hosts       {h['hosts']['count']} network namespaces, one supervisor each; the server"
                         f" listened on {', '.join(h['hosts']['server_listening_on'] or [])} and its Unix socket;"
                         f" dump {h['hosts']['dump']}")
        for kind, why in (h.get("kinds_left_out") or {}).items():
            lines.append(f"left out   {kind}: {why}")
        if h.get("disk"):
            lines.append(f"disk        ledger on a {h['disk']['tmpfs_mb']} MB tmpfs, {h['disk']['used_mb_at_end']} MB"
                         " used at the end")
    t = check.get("takeovers")
    if t and t.get("checked"):
        why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in t["explained"].items())
        clocks = t.get("clocks", {})
        lines.append(f"takeovers   {t['superseded']} superseded deliveries: {why}; {t['unexplained']} unexplained;"
                     f" {t['stall_windows']} stalls, the longest {t['longest_stall_ms']} ms")
        w = t.get("workers") or {}
        if (config or {}).get("workers") or any(w.values()):
            stopped = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in w.get("stopped_one_at_a_time", {}).items())
            released = ", ".join(f"{n} {k.replace('_', ' ')}"
                                 for k, n in w.get("released_with_their_worker", {}).items())
            lines.append(f"workers     deliveries stopped one at a time: {stopped or 'none'}; released with their"
                         f" worker (why it was replaced): {released or 'none'}")
        if clocks.get("skewed"):
            lines.append(f"clocks      {clocks['skewed']} of {clocks['supervisors']} supervisors skewed,"
                         f" {clocks['min_skew_ms']:+d}..{clocks['max_skew_ms']:+d} ms"
                         + (" (their hosts' wall clocks; the ledger's clock is the server's)"
                            if check.get("hosts") else ""))
        lines.extend(_host_lines(check, config))
    fl = check.get("failures")
    s = check.get("steps", {})
    r = check.get("stale_refused", {})
    # The built-in workload leaves evidence (a step log, an external system); an app of the user's
    # (`--app`) leaves none, and its figures would be zeros.
    evidence = s.get("begun", 0) or _get(check, "effects", "effect_ids")
    if fl and evidence:
        lines.append(f"failures    {fl['failed']} executions failed, {fl['planned']} as planned; {fl['step_errors']}"
                     " step errors recorded")
    elif fl:
        lines.append(f"failures    {fl['failed']} executions failed (the workflows' own outcomes: none may name the"
                     " storage)")
    lines.append(f"steps       {s.get('records', 0)} records; {s.get('begun', 0)} step runs began,"
                 f" {s.get('returned', 0)} returned, {s.get('retryable_errors', 0)} retryable errors,"
                 f" {s.get('values_seen', 0)} values checked" if evidence else
                 f"steps       {s.get('records', 0)} records (no step log: an app of your own)")
    if r:
        w, n, d = r["worker_writes"], r["renewals"], r["deliveries_lost"]
        e = r.get("ended_in_ledger", {"total": 0})  # reports written before it was counted
        lines.append(f"stale       refused: {w['total']} worker writes ({w['after_takeover']} after a takeover),"
                     f" {n['total']} renewals ({n['after_takeover']} after a takeover, the rest just after their"
                     f" own delivery ended); {e['total']} deliveries found ended in the ledger by the heartbeat's"
                     f" check before a renewal; {d['total']} deliveries ended lost")
    ef = check.get("effects")
    if ef and evidence:
        lines.append(f"effects     {ef['effect_ids']} effect ids, {ef['settled']} settled;"
                     f" {ef['executions_at_external_system']} executions at the external system (at most"
                     f" {ef['max_executions_per_id']} per id); {ef['repeat_requests_absorbed']} repeat requests"
                     f" answered from the idempotency key")
    st = check.get("stores", {})
    if st.get("counter") and evidence:
        c = st["counter"]
        lines.append(f"stores      counter {c['value']} after {c['increments_receipted']} receipted increments"
                     + (f"; mailbox {st['mailbox']['put']} put, {st['mailbox']['taken']} taken,"
                        f" {st['mailbox']['left']} left" if st.get("mailbox") else ""))
    lines.extend(_queue_lines(check))
    lines.extend(_message_line(check))
    lines = [wrapped for line in lines for wrapped in textwrap.wrap(line, WIDTH, subsequent_indent=" " * 12)]
    lines.append("invariants")
    by_kind = dict(check.get("violations_by_kind", {}))
    for label, kinds in INVARIANTS:
        n = sum(by_kind.pop(k, 0) for k in kinds)
        lines.append(f"  {'PASS' if n == 0 else 'FAIL'}  {label:<52} {n} violation{'s' if n != 1 else ''}")
    for kind, n in by_kind.items():
        lines.append(f"  FAIL  {kind:<52} {n} violation{'s' if n != 1 else ''}")
    for v in check.get("violations", [])[:8]:
        lines.append(f"    {v['kind']}: {v['execution_id'] or '-'}: {v['detail'][:150]}")
    if check.get("total_violations", 0) > 8:
        lines.append(f"    ... {check['total_violations'] - 8} more in the JSON report")
    verdict = "PASS" if check.get("ok") else "FAIL"
    lines.append(f"RESULT: {verdict}: {check.get('total_violations', 0)} violations,"
                 f" {e.get('not_terminal', 0)} executions not terminal")
    return lines


def _queue_lines(check: dict) -> list[str]:
    """Each limited queue's largest counts seen beside its limits: a largest count equal to its
    limit shows the limit bound; one above it is a violation."""
    lines = []
    for name, q in (check.get("queues") or {}).items():
        seen = []
        if q.get("concurrency") is not None:
            seen.append(f"most live leases {q['max_live']} of concurrency {q['concurrency']}")
        else:
            seen.append(f"most live leases {q['max_live']}")
        if q.get("per_key") is not None:
            seen.append(f"most per key {q['max_live_per_key']} of per_key {q['per_key']} ({q['keys']} keys)")
        if q.get("rate") is not None:
            count, seconds = q["rate"]
            seen.append(f"most claims in {seconds:g} s {q['max_claims_in_window']} of rate {count}")
        lines.append(f"queue       {name}: {q['executions']} executions, {q['deliveries']} deliveries; "
                     + ", ".join(seen))
    return lines


def _message_line(check: dict) -> list[str]:
    """The messages sent from outside (`chaos.messages`): sent, taken, repeats refused by id."""
    m = check.get("messages")
    if not m or not m.get("executions"):
        return []
    violations = sum(check.get("violations_by_kind", {}).get(kind, 0) for kind in MESSAGE_KINDS)
    return [f"messages    {m['stored']} of {m['planned']} sent to {m['executions']} executions in {m['sends_returned']}"
            f" sends ({m['sent_before_first_delivery']} before the execution's first delivery), {m['taken']} taken,"
            f" {m['duplicates_refused']} duplicate sends refused by id, {m['storage_errors_retried']} retried after a"
            f" storage error; a delivery that died had recorded the recv of {m['recorded_by_a_lost_delivery']} and"
            f" taken {m['taken_by_a_delivery_that_died']} more without recording it; {violations}"
            f" violation{'s' if violations != 1 else ''}"]


def _host_lines(check: dict, config: Optional[dict]) -> list[str]:
    """(`--hosts`) each host's leases, and the takeover times after a partition and a frozen host
    beside the lease."""
    hosts = check.get("hosts")
    if not hosts:
        return []
    lines = [f"host {host:<6} {h['supervisors']} supervisor{'s' if h['supervisors'] != 1 else ''},"
             f" {h['leases_held']} leases held; lost"
             f" {h['lost_to_partition']} to a partition, {h['lost_to_freeze']} to a freeze; stale refused after"
             f" healing {h['stale_refused_after_partition']}, after a thaw {h['stale_refused_after_freeze']}"
             for host, h in hosts.items()]
    lease = f"lease {config['lease_ms']} ms" if config else "lease ?"
    for kind, t in (_get(check, "takeovers", "takeover_after", default={}) or {}).items():
        what = {"partition": "a partition", "frozen_host": "a frozen host"}.get(kind, kind)
        lines.append(f"takeover    after {what}: " + (
            f"median {t['median_ms']} ms, p99 {t['p99_ms']} ms, max {t['max_ms']} ms over {t['count']} leases"
            f" ({lease})" if t.get("count") else f"no lease taken over ({lease})"))
    return lines


def save(report: dict, *, json_path: Optional[str] = None, summary_path: Optional[str] = None,
         html_path: Optional[str] = None) -> list[str]:
    """Write the JSON report, the summary and the page (by default as report.json, summary.txt
    and report.html in the run's work folder); return the lines to print: the summary, then
    where the three were written."""
    from .page import write_page

    folder = report.get("work_folder") or "."
    json_path = os.path.abspath(json_path or os.path.join(folder, "report.json"))
    summary_path = os.path.abspath(summary_path or os.path.join(folder, "summary.txt"))
    html_path = os.path.abspath(html_path or os.path.join(folder, "report.html"))
    lines = summary_lines(report)
    write_report(report, json_path)
    os.makedirs(os.path.dirname(summary_path), exist_ok=True)
    with open(summary_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    write_page(report, html_path)
    return lines + [f"report   {json_path}", f"summary  {summary_path}", f"page     {html_path}"]
