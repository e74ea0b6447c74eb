"""Commands that run processes: `supervise`, `demo`, and `chaos`."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading

import click

from . import (
    EXIT_BAD_INPUT,
    closed_down,
    fail,
    handles_errors,
    main,
    max_payload_bytes,
    max_payload_option,
    params,
)


class ListenAddress(click.ParamType):
    """`--metrics ADDR`, as `params.listen_address` reads it."""

    name = "address"

    def convert(self, value, param, ctx) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        try:
            return params.listen_address("--metrics", value, 9464)
        except ValueError as exc:
            self.fail(str(exc).removeprefix("--metrics "), param, ctx)  # click names the option itself


def _serve_metrics(address: tuple[str, int], db: str, durability: str):
    """The metrics server of `--metrics`, listening, or a clear error: prometheus_client is
    imported here and nowhere else on the supervisor's way, so that a plain install runs
    without it."""
    try:
        from ..metrics_server import serve_metrics
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "prometheus_client":
            raise
        fail("--metrics needs prometheus_client, which is not installed: pip install 'yieldstar[metrics]'")
    host, port = address
    try:
        return serve_metrics(host, port, db, durability)
    except OSError as exc:
        fail(f"--metrics: cannot listen on {host}:{port}: {exc.strerror or exc}")


@main.command()
@click.argument("app", callback=params.not_empty)
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Deliveries running at once (at most 10,000; at most 256 without --workers).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (at most 256), each running up to ceil(concurrency / workers) deliveries:"
                   " async workflows as tasks of one event loop, sync ones on threads. Default: one process per"
                   " delivery, the strongest isolation.")
@click.option("--lease-ms", type=params.timing_ms, default=30_000, show_default=True)
@click.option("--renew-ms", type=params.timing_ms, default=None, help="Default: a third of --lease-ms.")
@click.option("--heartbeat-ms", type=params.timing_ms, default=None,
              help="Default: 1000, or a tenth of --lease-ms when that is shorter.")
@click.option("--heartbeat-misses", type=click.IntRange(min=1, max=1000), default=3, show_default=True,
              help="Silent heartbeat intervals before a worker gives up on the supervisor, or it on them.")
@click.option("--poll-ms", type=params.timing_ms, default=500, show_default=True)
@click.option("--poll-only", is_flag=True,
              help="Find new work by polling every --poll-ms only, without listening for nudges (LISTEN on"
                   " PostgreSQL): for a connection pooler that cannot LISTEN.")
@click.option("--grace-ms", type=click.IntRange(min=0, max=params.MAX_TIMING_MS), default=10_000,
              show_default=True)
@click.option("--durability", type=click.Choice(["normal", "full"]), default="normal", show_default=True)
@max_payload_option
@click.option("--until-idle", is_flag=True,
              help="Exit once nothing is running and nothing of the workflows APP registers is due (executions of"
                   " other workflows, which this supervisor never claims, are not waited for).")
@click.option("--summary", "summary_s", type=params.Seconds(0.1, 86_400), default=None,
              help="Print a summary line every this many seconds (0.1 to 86400).")
@click.option("--quiet", is_flag=True, help="No line per delivery.")
@click.option("--verbose", is_flag=True, help="When the app cannot be loaded, print the whole traceback too.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="The log lines of the supervisor and its workers on stderr: text, or one JSON object a line"
                   " (ts, level, event, message, and execution_id, workflow, token, outcome, duration_ms, error"
                   " where they apply); json draws no status line.")
@click.option("--metrics", "metrics_addr", type=ListenAddress(), default=None, metavar="ADDR",
              help="Serve Prometheus metrics at http://ADDR/metrics: PORT alone listens on 127.0.0.1, HOST:PORT"
                   " on HOST (pip install 'yieldstar[metrics]').")
@click.pass_context
@handles_errors
def supervise(ctx, app, concurrency, workers, lease_ms, renew_ms, heartbeat_ms, heartbeat_misses, poll_ms, poll_only,
              grace_ms, durability, max_payload, until_idle, summary_s, quiet, verbose, log_format,
              metrics_addr) -> None:
    """Run a supervisor for the workflows defined in APP (a module name or a .py path).

    On a terminal, the last line is a live status (claimed, done, failed, running, workers up),
    redrawn in place twice a second below the log lines (not with --log-format json)."""
    from ..dispatcher import Supervisor, SupervisorConfig
    from ..ledger.errors import AppLoadFailed
    from ..log_format import LogFormat, configure

    if renew_ms is not None and renew_ms >= lease_ms:
        fail(f"--renew-ms ({renew_ms}) must be less than --lease-ms ({lease_ms}): a lease must outlast its renewals")
    config = SupervisorConfig(
        concurrency=concurrency, workers=workers, lease_ms=lease_ms, renew_ms=renew_ms, heartbeat_ms=heartbeat_ms,
        heartbeat_misses=heartbeat_misses,
        poll_ms=poll_ms, listen=not poll_only, grace_ms=grace_ms, durability=durability, log_format=log_format,
        max_payload_bytes=max_payload_bytes(max_payload))
    server = None if metrics_addr is None else _serve_metrics(metrics_addr, ctx.obj["db"], durability)
    supervisor = Supervisor(ctx.obj["db"], app, config, metrics=server.metrics if server else None, reap_orphans=True)
    as_json = config.log_format is LogFormat.JSON  # for a machine: every line an object, no status redrawn
    status = StatusLine(supervisor, sys.stderr) if sys.stderr.isatty() and not as_json else None
    configure(status.log_handler() if status else logging.StreamHandler(sys.stderr), log_format,
              logging.WARNING if quiet else logging.INFO)
    if server:
        host, port = server.address
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
        logging.getLogger("yieldstar.supervisor").info("serving metrics at %s", url,
                                                       extra={"event": "metrics_served", "url": url})
    if summary_s:
        _print_summaries(supervisor, summary_s, status)
    if status:
        status.start()
    try:
        code = supervisor.run(until_idle=until_idle)
    except AppLoadFailed as exc:
        if status:
            status.stop(keep=False)
        if as_json:  # one object, whose message is the line `fail` prints, with the traceback
            logging.getLogger("yieldstar.supervisor").error(
                "%s", exc, extra={"event": "app_not_loaded", "traceback": exc.details or None})
            sys.exit(EXIT_BAD_INPUT)
        if verbose and exc.details:
            click.echo(exc.details.rstrip("\n"), err=True)
        fail(str(exc))
    finally:
        if server:
            server.close()
    if status:
        status.stop()
    closed_down()
    sys.exit(code)


class StatusLine:
    """The live status of `supervise` on a terminal: one line, redrawn in place (a carriage
    return) about twice a second, always the last line. Log lines are written above it: the
    line is cleared, the log line written whole, and the status drawn again, under one lock, so
    that neither is ever cut into the other. (The workers' own warnings go straight to the
    terminal and may land beside it; they are rare.)"""

    def __init__(self, supervisor, stream, every_s: float = 0.5):
        self.supervisor = supervisor
        self.stream = stream
        self.every_s = every_s
        self._lock = threading.Lock()
        self._width = 0  # of the status as last drawn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-line", daemon=True)

    def text(self) -> str:
        s = self.supervisor.stats
        return (f"claimed {s.claimed}  done {s.completed}  failed {s.failed}  running {self.supervisor.running}"
                f"  {workers_up(self.supervisor)}"
                + (f"  suspended {s.suspended}" if s.suspended else "")
                + (f"  worker deaths {s.child_deaths}" if s.child_deaths else ""))

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, keep: bool = True) -> None:
        """Stop redrawing; leave the last status on its own line (`keep`), or erase it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if keep:
                self._draw()
                self._write("\n")
            else:
                self._write("\r" + " " * self._width + "\r")
            self._width = 0

    def line(self, text: str) -> None:
        """Write a whole line above the status."""
        with self._lock:
            self._write("\r" + text.ljust(self._width) + "\n")
            if not self._stop.is_set():
                self._draw()

    def log_handler(self) -> logging.Handler:
        status = self

        class AboveTheStatus(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    status.line(self.format(record))
                except (TypeError, ValueError):  # a bad format string in a log call
                    self.handleError(record)

        return AboveTheStatus()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._draw()
            if self._stop.wait(self.every_s):
                return

    def _draw(self) -> None:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns or 80  # 0: a terminal of unknown size
        except (OSError, ValueError):
            columns = 80
        text = self.text()[: max(1, columns - 1)]  # a wrapped line cannot be redrawn in place
        self._write("\r" + text.ljust(self._width))
        self._width = len(text)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away: the supervisor runs on


@main.command()
@click.option("--act", "acts", type=click.IntRange(1, 3), multiple=True,
              help="Play only this act (1: slow charge, 2: frozen worker, 3: killed supervisor); repeatable.")
@click.option("--keep", is_flag=True, help="Keep the temporary ledgers and logs, and say where.")
@handles_errors
def demo(acts: tuple[int, ...], keep: bool) -> None:
    """The order shop from RFC 002, with real processes, on a temporary database."""
    from ..demo import run_demo

    sys.exit(run_demo(sorted(set(acts)) or None, keep=keep, out=lambda line: click.echo(line)))


@main.command()
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seeds the workload and the fault plan: the same seed replays the same run, timing aside.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds of faults; the workload is admitted over the first 85% of them.")
@click.option("--supervisors", type=click.IntRange(min=1), default=None,
              help="Supervisors (default 3; with --hosts, one per host).")
@click.option("--hosts", type=click.IntRange(min=0, max=64), default=0, show_default=True,
              help="Run each supervisor in a network namespace of its own (a host), on a PostgreSQL server the run"
                   " starts for itself, listening on the hosts' veths only, and add the faults partition,"
                   " frozen_host and server_restart (clock_skew then shifts a host's wall clock). Needs root and"
                   " `ip`; leave out --db. 0: every supervisor on this machine.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Deliveries each supervisor runs at once: its workers, or with --workers up to 10,000.")
@click.option("--workers", type=click.IntRange(min=1, max=256), default=None,
              help="Worker processes per supervisor (passed to each as supervise --workers), each running several"
                   " deliveries at once: kill_child and freeze_child then take all of a worker's deliveries, and"
                   " the built-in workload adds async workflows. Default: one delivery per process.")
@click.option("--app", default="worker.apps.chaos", show_default=True,
              help="The workflows to run (a module name or a .py path): by default the built-in mixed workload,"
                   " whose evidence the checker reads; an app of your own defines chaos_workload(rng, count),"
                   " returning the (workflow name, input) pairs to admit, and gets the checks that need no"
                   " evidence (leases, tokens, stale writes, every execution terminal, no storage error).")
@click.option("--executions", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Executions the harness admits (workflows start more).")
@click.option("--lease-ms", type=click.IntRange(min=1), default=1500, show_default=True)
@click.option("--renew-ms", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--heartbeat-ms", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--faults", "fault_kinds", multiple=True, metavar="KINDS",
              help="Fault kinds, repeated or comma-separated (default all): kill_child, freeze_child,"
                   " kill_supervisor, freeze_supervisor, term_supervisor, slow_start on either backend;"
                   " hold_write_lock, disk_full (root only: the ledger goes on a tmpfs), clock_skew on SQLite only;"
                   " connection_kill on PostgreSQL only; partition, frozen_host, server_restart with --hosts"
                   " only (clock_skew too, shifting a host's wall clock); none for a control run. The default takes the kinds of"
                   " the ledger's backend and leaves out, with a notice, those this host cannot inject; naming a"
                   " kind that cannot run is an error.")
@click.option("--fault-interval-ms", type=click.IntRange(min=10), default=1200, show_default=True,
              help="Mean gap between two faults.")
@click.option("--lenient-supervisors", type=click.IntRange(min=0), default=None,
              help="How many supervisors run with --heartbeat-misses 100, so that their frozen workers write"
                   " on after a thaw and only the fencing token stops them (default: 1 when there are two or more).")
@click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Seconds to wait, after the faults, for every execution to become terminal.")
@click.option("--db", "chaos_db", default=None,
              help="The ledger: a SQLite path or a postgresql:// URI, which must hold no executions (default:"
                   " ledger.db in the work folder). The global --db is not used, so chaos never lands in a real"
                   " ledger by accident.")
@click.option("--workdir", default=None, help="The work folder for logs and evidence (default: a new"
                                               " temporary folder, kept).")
@click.option("--report", "report_path", default=None,
              help="Write the JSON report to this file (default: report.json in the work folder).")
@click.option("--summary", "summary_path", default=None,
              help="Write the one-screen summary to this file too (default: summary.txt in the work folder).")
@click.option("--html", "html_path", default=None,
              help="Write the report as a self-contained web page to this file (default: report.html in the work"
                   " folder): the verdict, a timeline per host with its supervisors, workers and faults, and the"
                   " deliveries of the executions that had takeovers or violations.")
@handles_errors
def chaos(seed, duration_s, supervisors, hosts, concurrency, workers, app, executions, lease_ms, renew_ms, heartbeat_ms,
          fault_kinds, fault_interval_ms, lenient_supervisors, drain_timeout_s, chaos_db, workdir, report_path,
          summary_path, html_path) -> None:
    """Kill, freeze and orphan supervisors and workers mid-step, then prove nothing was lost.

    The progress line abbreviates the fault kinds (kc kill_child, sc freeze_child, ...): a legend
    line printed at the start spells them out. At the end it prints the summary and where the
    JSON report, the summary and the page were written (by default into the work folder).

    Exit code 0 only if every execution is terminal and no invariant was violated."""
    from ..chaos import ChaosConfig, parse_kinds, run_chaos
    from ..chaos.report import save

    config = ChaosConfig(seed=seed, duration_s=duration_s, supervisors=supervisors or hosts or 3, hosts=hosts,
                         concurrency=concurrency, workers=workers, app=app,
                         executions=executions, lease_ms=lease_ms, renew_ms=renew_ms, heartbeat_ms=heartbeat_ms,
                         faults=parse_kinds(fault_kinds), fault_interval_s=fault_interval_ms / 1000,
                         lenient_supervisors=lenient_supervisors, drain_timeout_s=drain_timeout_s)
    report = run_chaos(config, folder=workdir, db_path=chaos_db, out=click.echo, tty=sys.stdout.isatty())
    click.echo("\n".join(save(report, json_path=report_path, summary_path=summary_path,
                               html_path=html_path)))  # and where they went
    sys.exit(0 if report["ok"] else 1)

def workers_up(supervisor) -> str:
    """`workers 250/256 up`: how many worker processes loaded the app and take deliveries, of how many."""
    return f"workers {supervisor.workers_up}/{supervisor.config.processes} up"


def _print_summaries(supervisor, every_s: float, status: StatusLine | None) -> None:
    summaries = logging.getLogger("yieldstar.summary")
    summaries.setLevel(logging.INFO)  # asked for: shown under --quiet too

    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(every_s):
            s = supervisor.stats
            line = (f"claimed {s.claimed}  completed {s.completed}  failed {s.failed}  suspended {s.suspended}"
                    f"  released {s.released}  lost {s.lost}  worker deaths {s.child_deaths}  {workers_up(supervisor)}")
            if status:
                status.line(line)
            elif supervisor.config.log_format == "json":  # a log line like the others, its counts as fields
                summaries.info("%s", line, extra={"event": "summary", **dataclasses.asdict(s)})
            else:
                click.echo(line, err=True)

    threading.Thread(target=loop, name="summary", daemon=True).start()
