"""The chaos report as one self-contained web page: a run's story seen, not only read.

    report.json --render()--> report.html: the verdict and the summary's lines,
                                           the host lanes (supervisors, workers, faults),
                                           the executions' lanes (deliveries, takeovers, causes),
                                           the violations

The page is one file: inline CSS and SVG, and a few lines of inline script (fit the host lanes to
the window, or keep them at their natural scale and scroll); nothing is fetched, so it works
from file:// and can be mailed. Only the standard library draws it (`html.escape` for every
string from the report), so the chaos tool needs no extra. Its size is bounded by the
report's timeline (`timeline.py` caps every list): a few hundred KB for a ten-minute run.

`yieldstar chaos` writes it beside report.json (`--html FILE` elsewhere); an existing report
is drawn with

    python -m supervisor.chaos.page report.json [-o report.html] [--folder WORKDIR]

where `--folder` rebuilds the timeline from the run's work folder, for a report written before
reports kept one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from ..ledger.errors import InvalidArgument, YieldstarError
from .lanes import DELIVERY_COLOURS, FAULT_COLOURS, HostLanes, esc, execution_lanes
from .report import summary_lines

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #263238; margin: 0 24px 40px; background: #fafafa; }
header { display: flex; align-items: baseline; gap: 18px; padding: 14px 0 6px; border-bottom: 1px solid #cfd8dc; }
header .verdict { font-size: 30px; font-weight: 700; padding: 2px 14px; border-radius: 6px; color: #fff; }
header .verdict.pass { background: #2e7d32; } header .verdict.fail { background: #c62828; }
h2 { font-size: 17px; margin: 26px 0 6px; }
.figures { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0; }
.figure { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 6px 12px; min-width: 120px; }
.figure b { display: block; font-size: 20px; } .figure.bad b { color: #c62828; }
pre { background: #fff; border: 1px solid #e0e0e0; padding: 8px 10px; overflow: auto; font-size: 12px;
  max-height: 22em; }
header h1 { font-size: 22px; margin: 0; } header .result { font-weight: 600; }
.scroll { overflow-x: auto; background: #fff; border: 1px solid #e0e0e0; }
svg.fitted { width: 100%; height: auto; }
svg.lanes text { font: 11px system-ui, sans-serif; fill: #263238; }
svg.lanes text.axis { fill: #78909c; font-size: 10px; } svg.lanes line.grid { stroke: #eceff1; }
svg.lanes rect.phase { fill: #fff8e1; } svg.lanes text.host { font-weight: 700; }
svg.lanes text.row { fill: #78909c; } svg.lanes text.code { font-size: 9px; font-weight: 600; }
g.life rect { fill: #b0bec5; } g.life.skewed rect { fill: #80cbc4; }
g.life.lenient rect { stroke: #546e7a; stroke-dasharray: 3 2; }
rect.worker { fill: #90a4ae; } rect.span { opacity: .35; } rect.band { opacity: .18; }
g.cause rect.span { opacity: .2; }
g.fault:target rect, g.fault:target path, g.fault:target line { stroke: #000; stroke-width: 3; }
rect.lane { fill: #fff; } g.execution.violated rect.lane { fill: #ffebee; }
g.execution text.id { font-weight: 600; } g.execution text.meta { fill: #607d8b; }
g.execution text.note { fill: #455a64; } g.execution.violated text.note { fill: #c62828; font-weight: 600; }
rect.lapsed { opacity: .35; } g.delivery.overlapping rect { stroke: #c62828; stroke-width: 1.5; }
svg.lanes text.token { font-size: 10px; paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; margin: 4px 0 8px; }
.legend span::before { content: ""; display: inline-block; width: 11px; height: 11px; margin-right: 4px;
  vertical-align: -1px; background: var(--c); border-radius: 2px; }
table { border-collapse: collapse; background: #fff; font-size: 12px; }
td, th { border: 1px solid #e0e0e0; padding: 3px 8px; text-align: left; vertical-align: top; }
button { font: inherit; font-size: 12px; }
.note { color: #607d8b; font-size: 13px; }
"""

# Fit the host lanes to the window or keep their scale (`#fit` in the address starts fitted).
SCRIPT = """
const lanes = document.getElementById("host-lanes");
const fit = document.getElementById("fit-lanes");
if (lanes && fit) {
  const set = on => { lanes.classList.toggle("fitted", on); fit.textContent = on ? "natural scale" : "fit to window"; };
  fit.addEventListener("click", () => set(!lanes.classList.contains("fitted")));
  set(location.hash === "#fit");
}
"""


def _figure(label: str, value, bad: bool = False) -> str:
    return f'<div class="figure{" bad" if bad else ""}"><b>{esc(value)}</b>{esc(label)}</div>'


def _figures(report: dict) -> str:
    check = report.get("check") or {}
    e = check.get("executions") or {}
    t = check.get("takeovers") or {}
    f = check.get("faults") or {}
    cards = [_figure("executions", e.get("admitted", 0)),
             _figure("not terminal", e.get("not_terminal", 0), bool(e.get("not_terminal"))),
             _figure("deliveries", e.get("deliveries", 0)),
             _figure("faults injected", f.get("total", 0))]
    if t.get("checked"):
        cards.append(_figure("takeovers", t.get("superseded", 0)))
        cards.append(_figure("unexplained takeovers", t.get("unexplained", 0), bool(t.get("unexplained"))))
    cards.append(_figure("violations", check.get("total_violations", 0), bool(check.get("total_violations"))))
    return '<div class="figures">' + "".join(cards) + "</div>"


def _legend(colours: dict, counts: Optional[dict] = None) -> str:
    return '<div class="legend">' + "".join(
        f'<span style="--c:{c}">{esc(name)}{f" {counts[name]}" if counts and name in counts else ""}</span>'
        for name, c in colours.items() if counts is None or name in counts) + "</div>"


def _violations(check: dict) -> str:
    violations = check.get("violations") or []
    if not violations:
        return ""
    rows = "".join(f"<tr><td>{esc(v.get('kind'))}</td><td>{esc(v.get('execution_id') or '-')}</td>"
                   f"<td>{esc(v.get('detail'))}</td></tr>" for v in violations)
    more = check.get("total_violations", 0) - len(violations)
    return (f'<h2 id="violations">Violations</h2><table><tr><th>kind</th><th>execution</th><th>detail</th></tr>{rows}'
            f"</table>" + (f'<p class="note">{more} more, counted but not detailed</p>' if more > 0 else ""))


def _timeline(report: dict) -> str:
    timeline = report.get("timeline")
    if not timeline:
        return ('<p class="note">This report has no timeline (it was written before reports kept one, or without the'
                " run's work folder): rebuild it with <code>python -m supervisor.chaos.page REPORT --folder"
                " WORKDIR</code>.</p>")
    faults = timeline.get("faults") or []
    kinds: dict = {}
    for f in faults:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    config = report.get("config") or {}
    lanes = HostLanes(timeline, config.get("duration_s"))
    parts = ['<h2>Hosts, supervisors and workers <button id="fit-lanes" type="button">fit to window</button></h2>'
             '<p class="note">Time from the first supervisor\'s start; the fault phase is shaded. Each supervisor'
             " row holds one supervisor after another (its clock skew beside its number), its workers' lanes"
             " under it (first to last delivery); faults are marked in their kind's colour: a cross for a kill,"
             " a span for what lasts. Hover a mark for its details.</p>",
             _legend(FAULT_COLOURS, kinds),
             f'<div class="scroll">{lanes.draw()}</div>']
    if timeline.get("faults_left_out"):
        parts.append(f'<p class="note">{timeline["faults_left_out"]} later faults not drawn.</p>')
    counts = timeline.get("execution_counts") or {}
    executions = timeline.get("executions") or []
    parts.append("<h2>Executions with takeovers or violations</h2>")
    parts.append(f'<p class="note">{len(executions)} of {counts.get("total", 0)} executions shown:'
                 f' {counts.get("with_violations", 0)} named by a violation, {counts.get("with_takeovers", 0)} with'
                 f" a takeover (a few of each reason), and a few others for comparison;"
                 f' {counts.get("left_out", 0)} not shown. Each lane has its own time axis; a bar is a delivery'
                 f" (its token and holder on it), coloured by how it ended; a takeover's bar is pale from its last"
                 f" renewal to its expiry, and the fault behind it is a dashed line that links to its mark"
                 f" above.</p>")
    ends: dict = {}
    for e in executions:
        for d in e.get("deliveries") or []:
            ends[d.get("end")] = ends.get(d.get("end"), 0) + 1
    parts.append(_legend(DELIVERY_COLOURS, ends))
    if executions:
        by_index = {f["i"]: f for f in faults}
        parts.append(f'<div class="scroll">{execution_lanes(executions, by_index)}</div>')
    return "\n".join(parts)


def render(report: dict) -> str:
    """The page of one chaos report (a `report.build_report` dict, or one read from report.json)."""
    check = report.get("check") or {}
    ok = bool(report.get("ok", check.get("ok")))
    config = report.get("config") or {}
    verdict = "PASS" if ok else "FAIL"
    title = f"yieldstar chaos, seed {config.get('seed', '?')}: {verdict}"
    lines = summary_lines(report)
    summary = "\n".join(lines)
    began = report.get("began")
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f'<header><span class="verdict {verdict.lower()}">{verdict}</span><div><h1>{esc(title)}</h1>'
        f'<span class="result">{esc(lines[-1])}</span>'
        + (f' <span class="note">{esc(began)} to {esc(report.get("ended"))}</span>' if began else "")
        + "</div></header>",
        _figures(report),
        f"<details open><summary>The summary</summary><pre>{esc(summary)}</pre></details>",
        _violations(check),
        _timeline(report),
        f"<script>{SCRIPT}</script>",
        "</body></html>",
        "",
    ])


def write_page(report: dict, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(report))


def read_report(path: str) -> dict:
    """A chaos report from its JSON file; `InvalidArgument` naming the file if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except OSError as exc:
        raise InvalidArgument(f"cannot read the report {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{path} is not JSON: {exc}") from None
    if not isinstance(report, dict) or "yieldstar_chaos_report" not in report:
        raise InvalidArgument(f"{path} is not a yieldstar chaos report (no yieldstar_chaos_report key)")
    return report


def timeline_from_folder(report: dict, folder: str) -> dict:
    """The timeline of a chaos run, rebuilt from its work folder (its ledger and evidence), as
    the checker builds it."""
    from .checker import check

    if not os.path.isdir(folder):
        raise InvalidArgument(f"--folder {folder} is not a folder")
    ledger = os.path.join(folder, "ledger.db")
    if not os.path.exists(ledger):
        ledger = report.get("ledger") or ledger
    return check(ledger, folder).timeline


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m supervisor.chaos.page REPORT [-o FILE] [--folder WORKDIR]`: exit 0 once the
    page is written, 2 (one line on stderr) if the report cannot be read."""
    parser = argparse.ArgumentParser(prog="python -m supervisor.chaos.page", description=__doc__.split("\n")[0])
    parser.add_argument("report", help="a chaos run's report.json")
    parser.add_argument("-o", "--output", help="the page to write (default: report.html beside the report)")
    parser.add_argument("--folder", help="rebuild the timeline from the run's work folder (its ledger and evidence)")
    args = parser.parse_args(argv)
    try:
        report = read_report(args.report)
        if args.folder:
            report["timeline"] = timeline_from_folder(report, args.folder)
        output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.report)), "report.html")
        write_page(report, output)
    except (YieldstarError, ValueError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{parser.prog}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    print(f"page     {os.path.abspath(output)} ({os.path.getsize(output) // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
