"""What happened when in a chaos run: the compact record the report keeps for its page.

The checker's figures say how many leases were lost and why; the page (`page.py`) also shows
when, and to whom. For that the report keeps, under its `timeline` key, every time in ms since
the first supervisor started, in true time (`clocks`):

- `supervisors`: each supervisor's life (fleet journal): its number, pid, host (`--hosts`), clock
  skew, when it started and ended, and how (killed, stopped...);
- `workers`: each worker process that ran a delivery (step log), under its supervisor, from its
  first delivery's claim to its last delivery's end: enough to give it a lane;
- `faults`: every injected fault (fault journal), with the window it really lasted where the
  evidence has it (a lock holder's own log, a burst's, a heal's, a restart's);
- `executions`: the deliveries of the executions worth looking at, each delivery with its token,
  holder, worker, claim, last renewal (for one taken over), end, how it ended, and for a takeover
  the reason `takeovers` found and the fault that gave it (`cause`, an index into `faults`).

A run has thousands of executions; the report keeps the interesting ones: those a violation
names, those with a takeover (chosen round the reasons, so that each reason shows), and a few
others for comparison, spread over the run, and counts the rest. Every list is capped, so a long
run's report and page stay bounded.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from .clocks import Clocks
from .takeovers import SLACK_MS, TAKEN_OVER

MAX_VIOLATED = 30  # executions a violation names
MAX_TAKEN_OVER = 40  # executions with a takeover
SAMPLE = 6  # executions with neither, for comparison
MAX_DELIVERIES = 30  # per execution: the first and last ones, and every takeover
MAX_FAULTS = 5_000
MAX_SUPERVISORS = 2_000
MAX_WORKERS = 4_000

# The faults that give each takeover reason, and whether they hit a supervisor (by number: the
# holder's) or the whole ledger.
CAUSES = {
    "holder_ended": ("kill_supervisor", "term_supervisor", "slow_start", "clock_skew"),
    "holder_frozen": ("freeze_supervisor",),
    "worker_fault": ("kill_child", "freeze_child", "slow_start"),
    "stall": ("hold_write_lock", "disk_full"),
    "host_frozen": ("frozen_host",),
    "holder_partitioned": ("partition",),
    "server_down": ("server_restart",),
    "claim_unanswered": ("connection_kill", "server_restart"),
}
LEDGER_WIDE = ("hold_write_lock", "disk_full", "server_restart", "connection_kill")


def fault_window(fault: dict, lock_holds: dict) -> tuple[int, int]:
    """When a journalled fault began and ended (epoch ms): its real window where the evidence
    has it, else its planned length (0 for a kill)."""
    at, params, target = fault.get("at_ms", 0), fault.get("params") or {}, fault.get("target") or {}
    kind = fault["kind"]
    if kind == "hold_write_lock":
        held, released = lock_holds.get(target.get("pid"), (None, None))
        if held is not None:
            return held, released if released is not None else held + int(params.get("seconds", 0) * 1000)
    if kind == "disk_full" and params.get("filling_ms"):
        return params["filling_ms"], params.get("freed_ms") or params["filling_ms"]
    if kind == "partition" and params.get("healed_ms"):
        return at, params["healed_ms"]
    if kind == "server_restart":
        began = params.get("began_ms") or at
        return began, params.get("started_ms") or began
    if kind == "slow_start":
        return at, at + int(params.get("import_delay_ms", 0))
    return at, at + int(params.get("seconds", 0) * 1000)


def _compact(record: dict) -> dict:
    """`record` without its empty fields: the report keeps one of these per fault and delivery."""
    return {k: v for k, v in record.items() if not (v is None or v is False or v == "" or v == [])}


def _detail(fault: dict) -> str:
    """A few words on a fault beyond its kind and target, for the page's labels."""
    params, kind = fault.get("params") or {}, fault["kind"]
    if kind == "clock_skew":
        return f"clock {params.get('previous_skew_ms', 0):+d} -> {params.get('skew_ms', 0):+d} ms"
    if kind == "slow_start":
        return (f"app import {params.get('import_delay_ms', 0)} ms, "
                f"{len(params.get('workers_killed') or [])} workers killed while loading it")
    if kind == "connection_kill":
        target = fault.get("target") or {}
        return f"session {target.get('session_pid')} ({target.get('application_name')}, {params.get('state')})"
    if kind == "disk_full" and params.get("error"):
        return f"burst failed: {params['error']}"
    return ""


class TimelineBuilder:
    """Builds the `timeline` of one checked run: give it what the checker read."""

    def __init__(self, *, history: dict, executions: dict, clocks: Clocks, faults: list[dict], lock_holds: dict,
                 step_pids: dict, reasons: dict, violations: list, lease_ms: int):
        self.history = history  # eid -> lease history rows (as the checker reads them)
        self.executions = executions  # eid -> executions rows (as the checker reads them)
        self.clocks = clocks
        self.journal = faults
        self.lock_holds = lock_holds
        self.step_pids = step_pids
        self.reasons = reasons  # (eid, token) of each delivery taken over -> its reason, or None
        self.violations = violations
        self.lease_ms = lease_ms
        lives = clocks.lives()
        starts = [life.started_ms for life in lives] or [
            self.clocks.true_ms(rows[0][2], rows[0][3]) for rows in history.values() if rows] or [0]
        self.t0 = min(starts)

    def rel(self, ms: Optional[int]) -> Optional[int]:
        return None if ms is None else int(ms - self.t0)

    def build(self) -> dict:
        faults = self._faults()
        executions, counts = self._executions(faults)
        ends = [f["at"] + f["ms"] for f in faults] + [d["to"] for e in executions for d in e["deliveries"]]
        supervisors = self._supervisors()
        ends += [s["to"] for s in supervisors if s["to"] is not None]
        phase = None
        if self.journal:
            first = self.journal[0]
            phase = self.rel(first.get("at_ms", 0) - int(first.get("at_s", 0) * 1000))
        return {
            "t0_ms": self.t0,
            "end": max(ends, default=0),
            "fault_phase_began": phase,
            "lease_ms": self.lease_ms,
            "supervisors": [_compact(s) for s in supervisors[:MAX_SUPERVISORS]],
            "supervisors_left_out": max(0, len(supervisors) - MAX_SUPERVISORS),
            "workers": self._workers(),
            "faults": [_compact(f) for f in faults[:MAX_FAULTS]],
            "faults_left_out": max(0, len(faults) - MAX_FAULTS),
            "executions": [dict(e, deliveries=[_compact(d) for d in e["deliveries"]]) for e in executions],
            "execution_counts": counts,
        }

    def _supervisors(self) -> list[dict]:
        return [{"n": life.number, "pid": life.pid, "host": life.host, "skew_ms": life.skew_ms or life.wall_skew_ms,
                 "lenient": life.lenient, "from": self.rel(life.started_ms), "to": self.rel(life.ended_ms),
                 "how": life.how}
                for life in sorted(self.clocks.lives(), key=lambda life: life.number)]

    def _workers(self) -> list[dict]:
        """Each worker that left lines in the step log, under the supervisor of its deliveries."""
        spans: dict[tuple[int, int], list] = {}
        for (eid, token), pids in self.step_pids.items():
            rows = self.history.get(eid, [])
            if len(pids) != 1 or not 1 <= token <= len(rows):
                continue
            row = rows[token - 1]
            life = self.clocks.life(row[2], row[3])
            if life is None:
                continue
            claimed, ended = self._span(eid, row)
            span = spans.setdefault((life.number, next(iter(pids))), [claimed, ended, 0])
            span[0], span[1], span[2] = min(span[0], claimed), max(span[1], ended), span[2] + 1
        workers = [{"pid": pid, "sup": number, "from": self.rel(a), "to": self.rel(b), "deliveries": n}
                   for (number, pid), (a, b, n) in sorted(spans.items(), key=lambda item: item[1][0])]
        return workers[:MAX_WORKERS]

    def _span(self, eid: str, row) -> tuple[int, int]:
        """A delivery's claim and end, true ms: its acknowledgement or release, or its last expiry."""
        _, token, holder, claimed_at, expires_at, ended_at, ended_by, _ = row
        execution = self.executions.get(eid)
        if ended_by is None and execution is not None and execution[4] == token and execution[5] is not None:
            expires_at = execution[5]  # the live lease: its expiry is kept on the execution
        end = ended_at if ended_at is not None and ended_by in ("acknowledged", "released") else expires_at
        return self.clocks.true_ms(holder, claimed_at), self.clocks.true_ms(holder, max(end, claimed_at))

    def _faults(self) -> list[dict]:
        found = []
        for i, fault in enumerate(self.journal):
            target, step = fault.get("target") or {}, fault.get("step") or {}
            began, ended = fault_window(fault, self.lock_holds)
            record = {"i": i, "kind": fault["kind"], "at": self.rel(began), "ms": max(0, ended - began),
                      "sup": target.get("supervisor"), "to_sup": target.get("replacement"),
                      "sups": target.get("supervisors"), "host": target.get("host"),
                      "worker": target.get("worker_pid"), "execution": step.get("execution_id"),
                      "token": step.get("token"), "detail": _detail(fault)}
            kills = (fault.get("params") or {}).get("workers_killed")
            if kills:
                record["kills"] = [[k["pid"], self.rel(k["at_ms"])] for k in kills]
            found.append(record)
        found.sort(key=lambda f: f["at"])
        return found

    # -- executions ----------------------------------------------------------------------------

    def _executions(self, faults: list[dict]) -> tuple[list[dict], dict]:
        violated: dict[str, list[str]] = defaultdict(list)
        for v in self.violations:
            if v.execution_id is not None:
                violated[v.execution_id].append(v.kind)
        taken = defaultdict(list)  # reason -> executions with a delivery taken over for it
        with_takeovers = set()
        for (eid, token), reason in sorted(self.reasons.items()):
            with_takeovers.add(eid)
            if eid not in taken[reason or "unexplained"]:
                taken[reason or "unexplained"].append(eid)
        chosen: dict[str, str] = {}
        for eid in list(violated)[:MAX_VIOLATED]:
            chosen[eid] = "violation"
        # Round the reasons, the unexplained first, so that each reason shows.
        queues = [taken.pop("unexplained", [])] + [taken[r] for r in sorted(taken)]
        picked = 0
        while picked < MAX_TAKEN_OVER and any(queues):
            for queue in queues:
                while queue and queue[0] in chosen:
                    queue.pop(0)
                if queue and picked < MAX_TAKEN_OVER:
                    chosen[queue.pop(0)] = "takeover"
                    picked += 1
        others = sorted((eid for eid in self.history if eid not in chosen and eid not in with_takeovers
                         and self.history[eid]), key=lambda eid: self.history[eid][0][3])
        for eid in others[::max(1, len(others) // SAMPLE)][:SAMPLE]:
            chosen[eid] = "sample"
        shown = [self._execution(eid, why, violated.get(eid, []), faults) for eid, why in chosen.items()
                 if eid in self.history or eid in self.executions]
        counts = {"total": len(self.executions), "with_takeovers": len(with_takeovers),
                  "with_violations": len(violated), "shown": len(shown), "left_out": len(self.executions) - len(shown)}
        return shown, counts

    def _execution(self, eid: str, why: str, violations: list[str], faults: list[dict]) -> dict:
        row = self.executions.get(eid)
        rows = self.history.get(eid, [])
        keep = rows
        if len(rows) > MAX_DELIVERIES:
            head, tail = MAX_DELIVERIES // 2, MAX_DELIVERIES // 3
            keep = rows[:head] + [r for r in rows[head:-tail] if r[6] in TAKEN_OVER][:MAX_DELIVERIES - head - tail] \
                + rows[-tail:]
        deliveries = [self._delivery(eid, r, faults) for r in keep]
        return {"id": eid, "workflow": row[1] if row else None, "status": row[3] if row else None, "why": why,
                "violations": sorted(set(violations)), "deliveries": deliveries,
                "deliveries_left_out": len(rows) - len(keep)}

    def _delivery(self, eid: str, row, faults: list[dict]) -> dict:
        _, token, holder, claimed_at, expires_at, _, ended_by, outcome = row
        life = self.clocks.life(holder, claimed_at)
        claimed, ended = self._span(eid, row)
        pids = self.step_pids.get((eid, token)) or ()
        found = {"t": token, "sup": life.number if life else None, "holder": None if life else holder,
                 "worker": min(pids) if pids else None, "from": self.rel(claimed), "to": self.rel(ended),
                 "end": ended_by or "live", "outcome": outcome}
        if ended_by in TAKEN_OVER:
            found["renewed"] = self.rel(self.clocks.true_ms(holder, expires_at - self.lease_ms))
            if (eid, token) in self.reasons:  # not when the takeovers could not be checked
                reason = self.reasons[(eid, token)]
                found["reason"] = reason or "unexplained"
                cause = self._cause(reason, life.number if life else None, eid, token, self.rel(ended), faults)
                if cause is not None:
                    found["cause"] = cause
        return found

    def _cause(self, reason: Optional[str], number: Optional[int], eid: str, token: int, expired: int,
               faults: list[dict]) -> Optional[int]:
        """The fault (its index in `faults`) behind a takeover `takeovers` explained with
        `reason`: one named for this delivery if any, else the latest of the reason's kinds that
        hit the holder (or the whole ledger) no later than its lease ran out."""
        kinds = CAUSES.get(reason or "", ())
        latest = None
        for f in faults:
            if f["kind"] not in kinds or f["at"] > expired + SLACK_MS:
                continue
            hit = (f["kind"] in LEDGER_WIDE or number in (f["sup"], *(f["sups"] or ()))
                   or (f["kind"] == "slow_start" and f["to_sup"] == number))
            if not hit:
                continue
            if f["execution"] == eid and f["token"] == token:
                return f["i"]
            latest = f["i"]
        return latest
