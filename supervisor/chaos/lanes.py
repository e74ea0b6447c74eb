"""The chaos page's two drawings, as inline SVG strings: the run's lanes and the executions'.

    host lanes (one time axis for the whole run)      execution lanes (each its own time axis)
    +-- ledger    lk===   df=     lk=====             e-42  completed  takeover
    +-- host this machine                               [t1 s3 ####////]  [t2 s5 ######]
    |   s1 ####################X  s4 ######            |ss <- the cause    holder_frozen
    |      -- -- --  (workers)  x                     e-97  completed  sample
    |   s2 ##############  s5 #########                 [t1 s2 ########]

Faults are marks in their kind's colour: a cross for a kill, a span for a freeze, a held lock,
a full disk, a cut-off host, a tick for the rest; each has an id (`f<n>`, its index in the fault
journal) that an execution's takeover links to, and a `<title>` with its details, which a browser
shows on hover. Every string from the report goes through `esc` (`html.escape`): execution ids
and holders are whatever the workflows and hosts made them.

Pure layout and markup: the timeline dict (`timeline.py`) in, SVG text out.
"""

from __future__ import annotations

import html
from typing import Iterable, Optional

from ..ui.timeline import COLOURS as DELIVERY_COLOURS, UNKNOWN_COLOUR
from .progress import SHORT

LABEL = 150  # px: the row labels' column of the host lanes
PX_PER_S = 6  # the host lanes' natural scale; the page can fit them to the window instead
MIN_PLOT, MAX_PLOT = 900, 4_000
SUP_ROW, WORKER_ROW, GAP = 18, 7, 6
EXEC_LABEL, EXEC_PLOT, EXEC_ROW = 300, 760, 56

FAULT_COLOURS = {
    "kill_child": "#c62828", "freeze_child": "#1e88e5", "kill_supervisor": "#8e0000",
    "freeze_supervisor": "#0d47a1", "term_supervisor": "#6d4c41", "hold_write_lock": "#8d6e63",
    "disk_full": "#ef6c00", "slow_start": "#7b1fa2", "clock_skew": "#00838f", "connection_kill": "#ad1457",
    "partition": "#f9a825", "frozen_host": "#283593", "server_restart": "#4e342e",
}
SPANS = ("freeze_child", "freeze_supervisor", "hold_write_lock", "disk_full", "partition", "frozen_host",
         "server_restart", "slow_start")
KILLS = ("kill_child", "kill_supervisor")
SHORT_NAMES = {kind.value: short for kind, short in SHORT.items()}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def seconds(ms: Optional[int]) -> str:
    return "?" if ms is None else f"{ms / 1000:.1f} s"


def colour(kind: str) -> str:
    return FAULT_COLOURS.get(kind, "#546e7a")


def fault_title(f: dict) -> str:
    """A fault's details, one line each, for its `<title>`."""
    lines = [f"{f['kind']} at {seconds(f.get('at'))}" + (f" for {f['ms']} ms" if f.get("ms") else "")]
    if f.get("sup") is not None:
        lines.append(f"supervisor {f['sup']}" + (f" (replaced by {f['to_sup']})" if f.get("to_sup") else ""))
    if f.get("sups"):
        lines.append("supervisors " + ", ".join(str(n) for n in f["sups"]))
    if f.get("host") is not None:
        lines.append(f"host {f['host']}")
    if f.get("worker"):
        lines.append(f"worker pid {f['worker']}")
    if f.get("execution") is not None:
        lines.append(f"inside a step of {f['execution']} token {f.get('token')}")
    if f.get("detail"):
        lines.append(f["detail"])
    return esc("\n".join(lines))


def _pack(items: list[dict], end: int) -> list[list[dict]]:
    """Items with `from`/`to` (None: still on at `end`) in as few rows as never overlap."""
    rows: list[list[dict]] = []
    ends: list[int] = []
    for item in sorted(items, key=lambda i: i.get("from", 0)):
        start = item.get("from", 0)
        for n, last in enumerate(ends):
            if last <= start:
                rows[n].append(item)
                ends[n] = item.get("to") if item.get("to") is not None else end
                break
        else:
            rows.append([item])
            ends.append(item.get("to") if item.get("to") is not None else end)
    return rows


def _axis(x, start: int, end: int, y: int, height: int, left: float) -> list[str]:
    """Tick lines and labels every round number of seconds, about 100 px apart."""
    span_s = max((end - start) / 1000, 0.001)
    width = x(end) - x(start)
    step = next((s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)
                 if width / (span_s / s) >= 90), 7200)
    out = []
    t = (start // int(step * 1000) + 1) * step * 1000 if start % int(step * 1000) else start
    while t <= end:
        px = x(t)
        if px >= left:
            out.append(f'<line class="grid" x1="{px:.1f}" x2="{px:.1f}" y1="{y}" y2="{y + height}"/>'
                       f'<text class="axis" x="{px:.1f}" y="{y - 4}" text-anchor="middle">{t / 1000:g} s</text>')
        t += step * 1000
    return out


# -- the host lanes --------------------------------------------------------------------------------

class HostLanes:
    """The whole run on one time axis: a row for the ledger's faults, then per host its
    supervisors (their lives packed into as few rows as never overlap), each row with its
    workers' lanes under it."""

    def __init__(self, timeline: dict, fault_phase_s: Optional[float] = None):
        self.t = timeline
        self.end = max(timeline.get("end") or 0, 1)
        self.plot = min(max(self.end / 1000 * PX_PER_S, MIN_PLOT), MAX_PLOT)
        self.fault_phase_s = fault_phase_s
        self.out: list[str] = []
        self.y = 28
        self.rows: dict[int, tuple[int, dict[int, int]]] = {}  # supervisor -> (its row's y, {worker pid: y})

    def x(self, ms: Optional[int]) -> float:
        return LABEL + min(max(ms or 0, 0), self.end) / self.end * self.plot

    def draw(self) -> str:
        faults = self.t.get("faults") or []
        ledger = [f for f in faults if f["kind"] in ("hold_write_lock", "disk_full", "server_restart",
                                                     "connection_kill")]
        body: list[str] = []
        if ledger:
            body.append(self._label(self.y, "ledger", "faults that stall or cut every process's ledger"))
            body.extend(self._mark(f, self.y, SUP_ROW) for f in ledger)
            self.y += SUP_ROW + GAP * 2
        by_host: dict = {}
        for s in self.t.get("supervisors") or []:
            by_host.setdefault(s.get("host"), []).append(s)
        workers: dict[int, list] = {}
        for w in self.t.get("workers") or []:
            workers.setdefault(w["sup"], []).append(w)
        for host, sups in sorted(by_host.items(), key=lambda item: (item[0] is not None, item[0] or 0)):
            body.extend(self._host(host, sups, workers, faults))
        width = LABEL + self.plot + 20
        height = self.y + 8
        head = [f'<svg class="lanes hosts" id="host-lanes" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}"'
                f' height="{height}" viewBox="0 0 {width:.0f} {height}">']
        phase = self.t.get("fault_phase_began")
        if phase is not None:
            ends = phase + (self.fault_phase_s * 1000 if self.fault_phase_s else self.end)
            head.append(f'<rect class="phase" x="{self.x(phase):.1f}" y="18" width="{self.x(ends) - self.x(phase):.1f}"'
                        f' height="{height - 18}"><title>the fault phase</title></rect>')
        head.extend(_axis(self.x, 0, self.end, 18, height - 18, LABEL))
        return "\n".join(head + body + ["</svg>"])

    def _label(self, y: int, text: str, title: str = "", cls: str = "row") -> str:
        return f'<text class="{cls}" x="4" y="{y + 12}"><title>{esc(title)}</title>{esc(text)}</text>'

    def _host(self, host, sups: list[dict], workers: dict, faults: list[dict]) -> list[str]:
        out = [self._label(self.y, "this machine" if host is None else f"host {host}", cls="host")]
        top = self.y
        self.y += 16
        for row in _pack(sups, self.end):
            y = self.y
            out.append(self._label(y, "supervisors", "supervisor lives, one after another"))
            out.extend(self._life(s, y) for s in row)
            worker_rows = _pack([w for s in row for w in workers.get(s["n"], [])], self.end)
            for n, lane in enumerate(worker_rows):
                wy = y + SUP_ROW + 2 + n * WORKER_ROW
                for w in lane:
                    self.rows.setdefault(w["sup"], (y, {}))[1][w["pid"]] = wy
                    out.append(f'<rect class="worker" x="{self.x(w["from"]):.1f}" y="{wy}"'
                               f' width="{max(self.x(w["to"]) - self.x(w["from"]), 1):.1f}" height="4">'
                               f'<title>worker pid {esc(w["pid"])} of supervisor {esc(w["sup"])}:'
                               f' {esc(w["deliveries"])}'
                               f' deliveries, {seconds(w["from"])} to {seconds(w["to"])}</title></rect>')
            for s in row:
                self.rows.setdefault(s["n"], (y, {}))
            self.y = y + SUP_ROW + 2 + len(worker_rows) * WORKER_ROW + GAP
        numbers = {s["n"] for s in sups}
        for f in faults:
            if f["kind"] in ("partition", "frozen_host") and set(f.get("sups") or ()) & numbers:
                out.append(self._band(f, top, self.y - top))
            elif f["kind"] not in ("hold_write_lock", "disk_full", "server_restart", "connection_kill") \
                    and (f.get("sup") in numbers or f.get("to_sup") in numbers):
                out.append(self._on_supervisor(f))
        self.y += GAP
        return out

    def _life(self, s: dict, y: int) -> str:
        x1, x2 = self.x(s.get("from")), self.x(s.get("to") if s.get("to") is not None else self.end)
        skew = f" {s['skew_ms']:+d} ms" if s.get("skew_ms") else ""
        title = (f"supervisor {s['n']} (pid {s.get('pid')}){', lenient' if s.get('lenient') else ''},"
                 f" clock{skew or ' true'}: {seconds(s.get('from'))} to"
                 f" {seconds(s.get('to')) if s.get('to') is not None else 'the end'} ({s.get('how') or 'running'})")
        cls = "life" + (" skewed" if skew else "") + (" lenient" if s.get("lenient") else "")
        label = f"s{s['n']}{skew}" if x2 - x1 > 26 + 6 * len(skew) else ""
        end = ""
        if s.get("how") == "killed":
            end = _cross(x2, y + SUP_ROW / 2, 4, "#8e0000")
        return (f'<g class="{cls}"><title>{esc(title)}</title><rect x="{x1:.1f}" y="{y + 2}"'
                f' width="{max(x2 - x1, 1):.1f}" height="{SUP_ROW - 4}" rx="2"/>'
                f'<text x="{x1 + 3:.1f}" y="{y + 13}">{esc(label)}</text>{end}</g>')

    def _on_supervisor(self, f: dict) -> str:
        """A fault of a supervisor (on its row) or of one of its workers (on the worker's lane)."""
        number = f.get("sup") if f.get("sup") in self.rows else f.get("to_sup")
        y, workers = self.rows.get(number, (self.y, {}))
        if f["kind"] in ("kill_child", "freeze_child"):
            return self._mark(f, workers.get(f.get("worker"), y + SUP_ROW), WORKER_ROW)
        parts = [self._mark(f, y, SUP_ROW, block=max(workers.values(), default=y) + WORKER_ROW - y)]
        for pid, at in f.get("kills") or []:  # a slow start's workers, killed while loading the app
            replacement = self.rows.get(f.get("to_sup"), (y, {}))[0]
            what = f"worker pid {pid} of the slow start, killed while loading the app, at {seconds(at)}"
            parts.append(f'<g class="fault kill_child"><title>{esc(what)}</title>'
                         f'{_cross(self.x(at), replacement + SUP_ROW + 4, 3, colour("kill_child"))}</g>')
        return "".join(parts)

    def _band(self, f: dict, y: int, height: int) -> str:
        x1, x2 = self.x(f["at"]), self.x(f["at"] + f.get("ms", 0))
        return (f'<g class="fault {esc(f["kind"])}" id="f{esc(f["i"])}"><title>{fault_title(f)}</title>'
                f'<rect class="band" x="{x1:.1f}" y="{y}" width="{max(x2 - x1, 2):.1f}" height="{height}"'
                f' fill="{colour(f["kind"])}"/><text class="code" x="{x1:.1f}" y="{y + 10}">'
                f'{esc(SHORT_NAMES.get(f["kind"], f["kind"]))}</text></g>')

    def _mark(self, f: dict, y: float, height: int, block: Optional[int] = None) -> str:
        """A fault at row `y`: a span over the row (and the `block` under it, for a frozen
        supervisor's workers), a cross, or a tick; labelled with its short name."""
        kind, c = f["kind"], colour(f["kind"])
        x1 = self.x(f["at"])
        code = SHORT_NAMES.get(kind, kind)
        if kind in SPANS and f.get("ms"):
            width = max(self.x(f["at"] + f["ms"]) - x1, 2)
            tall = block if kind == "freeze_supervisor" and block else height
            shape = (f'<rect class="span" x="{x1:.1f}" y="{y}" width="{width:.1f}" height="{tall}" fill="{c}"/>'
                     f'<rect x="{x1:.1f}" y="{y}" width="{width:.1f}" height="2" fill="{c}"/>')
        elif kind in KILLS:
            shape = _cross(x1, y + height / 2, max(3, height / 3), c)
        else:
            shape = (f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{y - 1}" y2="{y + height + 1}" stroke="{c}"'
                     f' stroke-width="2"/>')
        label = (f'<text class="code" x="{x1 + 2:.1f}" y="{y + 8}" fill="{c}">{esc(code)}</text>'
                 if height >= SUP_ROW else "")
        return f'<g class="fault {esc(kind)}" id="f{esc(f["i"])}"><title>{fault_title(f)}</title>{shape}{label}</g>'


def _cross(x: float, y: float, r: float, c: str) -> str:
    return (f'<path d="M{x - r:.1f} {y - r:.1f}L{x + r:.1f} {y + r:.1f}'
            f'M{x - r:.1f} {y + r:.1f}L{x + r:.1f} {y - r:.1f}"'
            f' stroke="{c}" stroke-width="2"/>')


# -- the execution lanes ---------------------------------------------------------------------------

def execution_lanes(executions: Iterable[dict], faults: dict[int, dict]) -> str:
    """One lane per execution, each on its own time axis from just before its first claim to
    just after its last delivery ended: its deliveries as bars coloured by how each ended, a
    takeover's bar solid to its last renewal and pale to its expiry, and the fault behind each
    takeover marked where it struck, linked to its mark in the host lanes."""
    rows = []
    y = 4
    for e in executions:
        rows.append(_execution(e, y, faults))
        y += EXEC_ROW
    width = EXEC_LABEL + EXEC_PLOT + 10
    return "\n".join([f'<svg class="lanes executions" xmlns="http://www.w3.org/2000/svg" width="{width}"'
                      f' height="{y + 4}" viewBox="0 0 {width} {y + 4}">', *rows, "</svg>"])


def _execution(e: dict, y: int, faults: dict[int, dict]) -> str:
    deliveries = e.get("deliveries") or []
    causes = [faults[d["cause"]] for d in deliveries if d.get("cause") in faults]
    start = min([d.get("from", 0) for d in deliveries] + [f["at"] for f in causes], default=0)
    end = max([d.get("to", 0) for d in deliveries], default=start)
    pad = max((end - start) // 20, 50)
    start, end = start - pad, end + pad

    def x(ms) -> float:
        return EXEC_LABEL + (ms - start) / max(end - start, 1) * EXEC_PLOT

    ident = e.get("id") or ""
    shown = ident if len(ident) <= 36 else ident[:35] + "…"
    cls = "execution" + (" violated" if e.get("violations") else "")
    workflow = f" ({e['workflow']})" if e.get("workflow") else ""
    out = [f'<g class="{cls}"><rect class="lane" x="0" y="{y}" width="{EXEC_LABEL + EXEC_PLOT + 10}"'
           f' height="{EXEC_ROW - 4}"/>'
           f'<text class="id" x="6" y="{y + 15}"><title>{esc(ident + workflow)}</title>{esc(shown)}</text>'
           f'<text class="meta" x="6" y="{y + 32}">{esc(e.get("status") or "?")} · {esc(e.get("why"))}'
           f' · {len(deliveries) + e.get("deliveries_left_out", 0)} deliveries · {seconds(start)} to'
           f' {seconds(end)}</text>']
    notes = []
    # Where the checker found leases that overlap, a bar that starts before an earlier one ended
    # drops half a bar, outlined, so that both show. (Elsewhere a skewed clock may make a claim
    # look a few ms early: the checker judged that, not the drawing.)
    overlapped = "lease_overlap" in (e.get("violations") or ())
    live_until = None
    for d in deliveries:
        x1, x2 = x(d.get("from", 0)), x(d.get("to", 0))
        c = DELIVERY_COLOURS.get(d.get("end"), UNKNOWN_COLOUR)
        overlapping = overlapped and live_until is not None and d.get("from", 0) < live_until
        live_until = max(live_until or d.get("to", 0), d.get("to", 0))
        by = y + (12 if overlapping else 6)
        who = f"s{d['sup']}" if d.get("sup") is not None else d.get("holder") or "?"
        title = (f"token {d['t']} held by {'supervisor ' + str(d['sup']) if d.get('sup') is not None else who}"
                 + (f", worker pid {d['worker']}" if d.get("worker") else "")
                 + f": claimed at {seconds(d.get('from'))}, {d.get('end')} at {seconds(d.get('to'))}"
                 + (f" ({d['outcome']})" if d.get("outcome") else "")
                 + (f"; last renewed at {seconds(d['renewed'])}; taken over: {d.get('reason')}"
                    if "reason" in d else ""))
        renewed = x(d["renewed"]) if "renewed" in d else x2
        renewed = min(max(renewed, x1), x2)
        out.append(f'<g class="delivery {esc(d.get("end"))}{" overlapping" if overlapping else ""}"'
                   f' data-token="{esc(d["t"])}"><title>{esc(title)}</title>'
                   f'<rect x="{x1:.1f}" y="{by}" width="{max(renewed - x1, 2):.1f}" height="14" fill="{c}"/>'
                   + (f'<rect class="lapsed" x="{renewed:.1f}" y="{by}" width="{x2 - renewed:.1f}" height="14"'
                      f' fill="{c}"/>' if x2 > renewed else "")
                   + f'<text class="token" x="{x1 + 2:.1f}" y="{by + 11}">{esc(d["t"])} {esc(who)}</text></g>')
        if "reason" in d:
            notes.append((x2, f"{d['t']}: {d['reason']}"))
        f = faults.get(d.get("cause"))
        if f is not None:
            fx = x(f["at"])
            span = ""
            if f.get("ms"):  # what lasted (a freeze, a held lock...): how long, beside the lease it cost
                fx2 = min(x(f["at"] + f["ms"]), EXEC_LABEL + EXEC_PLOT)
                span = (f'<rect class="span" x="{fx:.1f}" y="{y + 3}" width="{max(fx2 - fx, 1):.1f}" height="20"'
                        f' fill="{colour(f["kind"])}"/>')
            out.append(f'<a href="#f{esc(f["i"])}"><g class="cause"><title>caused the takeover of token {esc(d["t"])}:'
                       f' {fault_title(f)}</title>{span}<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{y + 2}" y2="{y + 24}"'
                       f' stroke="{colour(f["kind"])}" stroke-width="2" stroke-dasharray="3 2"/>'
                       f'<text class="code" x="{fx + 2:.1f}" y="{y + 33}" fill="{colour(f["kind"])}">'
                       f'{esc(SHORT_NAMES.get(f["kind"], f["kind"]))} {esc(f["kind"])}</text></g></a>')
    if notes or e.get("violations"):
        text = "; ".join(n for _, n in notes[:3])
        if e.get("violations"):
            text = "violated: " + ", ".join(e["violations"]) + ("; " + text if text else "")
        out.append(f'<text class="note" x="6" y="{y + 47}">{esc(text)}</text>')
    out.append("</g>")
    return "".join(out)
