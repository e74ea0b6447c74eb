"""The supervisors of a chaos run: started in process groups of their own, replaced, signalled,
reaped, and stopped, with every exit judged and every orphaned worker accounted for.

Each supervisor has two properties besides its leniency: its clock skew (`skewed_env`: the
environment variable `YIELDSTAR_CHAOS_CLOCK_SKEW_MS`, and `skewed_clock/` first on PYTHONPATH,
whose `sitecustomize` gives the SQLite backend of the supervisor and of each of its workers, which
inherit both, a default clock that adds the skew) and its app's import delay (`YIELDSTAR_CHAOS_IMPORT_DELAY_MS`, read by
`worker.apps.chaos`). The fleet journal (`supervisors.jsonl`) records every start, with those
properties and the pid that the ledger's lease history names as the holder, and every exit: the
checker needs both to set ledger times beside each other and to know who was alive when.

With `--hosts` (`hosts` given), each supervisor runs inside one host's network namespace and
reaches the database at the server's address on that host's veth; a replacement goes into the
host of the supervisor it replaces, and `ensure` keeps one supervisor per host. A clock skew is
then a skew of the host's wall clock (`wall_clock.shifted_env`: CLOCK_REALTIME, `time()`,
`gettimeofday()` of the supervisor and its workers), journalled as `wall_skew_ms`: the ledger's
times are the server's whatever the hosts' clocks say, so the ledger clock's `skew_ms` is 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import psutil

from worker.apps.chaos import IMPORT_DELAY_ENV, IMPORT_LOG_ENV

from ..pool import is_template_command, is_worker_command

from . import faults
from .watch import IMPORT_LOG

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TICK_S = 0.05
ORPHAN_GRACE_S = 5.0  # a dead supervisor's workers must be gone by then
STOP_PATIENCE_S = 15.0  # beyond the grace period, for a supervisor to stop after SIGTERM
STARTUP_PATIENCE_S = 30.0  # for a supervisor to start up before it is stopped
LENIENT_MISSES = 100  # heartbeat misses a lenient supervisor and its workers tolerate
CLOCK_SKEW_ENV = "YIELDSTAR_CHAOS_CLOCK_SKEW_MS"  # read by skewed_clock/sitecustomize.py
SKEWED_CLOCK_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skewed_clock")
JOURNAL = "supervisors.jsonl"


def skewed_env(skew_ms: int, env: dict) -> dict:
    """`env` for a process whose SQLite ledger clock, and its children's, runs `skew_ms` ahead of
    the wall clock (behind, if negative): see skewed_clock/sitecustomize.py."""
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in (SKEWED_CLOCK_SITE, env.get("PYTHONPATH")) if p),
                **{CLOCK_SKEW_ENV: str(skew_ms)})

RUNNING, FROZEN, STOPPING, KILLED, EXITED = "running", "frozen", "stopping", "killed", "exited"


@dataclass
class SupervisorHandle:
    number: int
    popen: subprocess.Popen
    log_path: str
    process: psutil.Process
    lenient: bool = False
    skew_ms: int = 0
    import_delay_ms: int = 0
    state: str = RUNNING
    stop_deadline: Optional[float] = None
    listed_at: float = 0.0  # when its workers were last listed
    ready: bool = False  # it logged that it is supervising
    workers_seen: dict = field(default_factory=dict)  # pid -> psutil.Process, every worker ever listed
    host: Any = None  # its `hosts.Host` (`--hosts`), or None on the harness's own machine
    wall_skew_ms: int = 0  # how far its host's wall clock runs ahead (`--hosts`)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def workers(self) -> list[psutil.Process]:
        try:
            children = self.process.children()
        except psutil.Error:
            return []
        found = []
        for child in children:
            try:
                if is_worker_command(child.cmdline()) and faults.alive(child):
                    found.append(child)
                    self.workers_seen.setdefault(child.pid, child)
            except psutil.Error:
                continue
        return found

    def loaders(self) -> list[psutil.Process]:
        """Its processes that may be importing the app: its workers, and the template process
        that imports it once to fork them (`supervisor.template`)."""
        found = self.workers()
        try:
            children = self.process.children()
        except psutil.Error:
            return found
        for child in children:
            try:
                if is_template_command(child.cmdline()) and faults.alive(child):
                    found.append(child)
            except psutil.Error:
                continue
        return found

    def started_up(self) -> bool:
        """True once it logged that it is supervising: from then on SIGTERM means a graceful stop
        (before, the interpreter has not installed its handler and dies of the signal)."""
        if not self.ready:
            try:
                with open(self.log_path, errors="replace") as f:
                    self.ready = "supervising " in f.read(65536)
            except OSError:
                pass
        return self.ready

    def log_tail(self, lines: int = 3) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(line.strip() for line in f.readlines()[-lines:])
        except OSError:
            return ""


class Fleet:
    """The supervisors of one run: started, replaced, signalled, reaped, and stopped.

    `lenient_supervisors` of them run with `--heartbeat-misses 100`: their workers keep going
    through a freeze of their whole group, so after SIGCONT they carry on writing with a token
    that was superseded meanwhile, and only the ledger's fence stops them (RFC 002's frozen
    worker). The others run with the default 3 misses, so their workers stop on their own first.
    """

    def __init__(self, config, db_path: str, folder: str, anomaly: Callable[[str, str], None],
                 skew: Callable[[], int] = lambda: 0, hosts: Sequence[Any] = ()):
        """`skew()` draws the clock skew (ms) of each supervisor started without one given; `hosts`
        (`--hosts`): the hosts to run one supervisor each in, on `db_path` as each reaches it."""
        self.config = config
        self.hosts = list(hosts)
        self.cwd = os.getcwd()
        self.db_path = db_path
        self.folder = folder
        self.anomaly = anomaly
        self.skew = skew
        self.handles: list[SupervisorHandle] = []
        self._orphan_checks: list[tuple[float, SupervisorHandle]] = []
        self.exits: dict[str, int] = {}
        self._journal = open(os.path.join(folder, JOURNAL), "a")

    def _note(self, event: str, h: SupervisorHandle, **more) -> None:
        self._journal.write(json.dumps({"event": event, "number": h.number, "pid": h.pid,
                                        "at_ms": time.time_ns() // 1_000_000, **more}) + "\n")
        self._journal.flush()

    def start_one(self, *, lenient: Optional[bool] = None, skew_ms: Optional[int] = None,
                  import_delay_ms: int = 0, host: Any = None) -> SupervisorHandle:
        """Start a supervisor; lenient if fewer than `lenient_supervisors` members are; with its
        clock `skew_ms` ahead (or behind, if negative; drawn by the fleet's `skew` when None), and
        an app that takes `import_delay_ms` to import in each of its workers; inside `host` (which
        a fleet of hosts needs), whose wall clock the skew then shifts."""
        if bool(self.hosts) != (host is not None):
            raise ValueError("a fleet of hosts starts each supervisor in one host, and only such a fleet does")
        c = self.config
        if lenient is None:
            lenient = sum(1 for h in self.members() if h.lenient) < c.lenient_supervisors
        if skew_ms is None:
            skew_ms = self.skew()
        number = len(self.handles) + 1
        log_path = os.path.join(self.folder, "logs", f"supervisor-{number:03d}.log")
        # The runtime's checkout, then the folder the run was started from (a user's app named by
        # module is imported from there, as `yieldstar supervise` imports it from the current folder).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (ROOT, self.cwd, os.environ.get("PYTHONPATH")) if p))
        for name in (CLOCK_SKEW_ENV, IMPORT_DELAY_ENV, IMPORT_LOG_ENV):
            env.pop(name, None)  # from the harness's own environment: only what is drawn here counts
        wall_skew_ms = 0
        if host is not None:
            from .wall_clock import shifted_env

            skew_ms, wall_skew_ms = 0, skew_ms  # the ledger's clock is the server's: only the wall clock moves
            if wall_skew_ms:
                env = shifted_env(wall_skew_ms, env)
        elif skew_ms:
            env = skewed_env(skew_ms, env)
        if import_delay_ms:
            env[IMPORT_DELAY_ENV] = str(import_delay_ms)
            env[IMPORT_LOG_ENV] = os.path.join(self.folder, IMPORT_LOG)
        argv = [sys.executable, "-m", "supervisor.cli", "--db", host.uri(self.db_path) if host else self.db_path,
                "supervise", c.app, "--concurrency", str(c.concurrency), "--lease-ms", str(c.lease_ms),
                "--renew-ms", str(c.renew_ms), "--heartbeat-ms", str(c.heartbeat_ms), "--poll-ms", str(c.poll_ms),
                "--grace-ms", str(c.grace_ms), "--heartbeat-misses", str(LENIENT_MISSES if lenient else 3)]
        if c.workers:
            argv += ["--workers", str(c.workers)]
        with open(log_path, "ab") as log:
            popen = (host.popen if host is not None else subprocess.Popen)(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, env=env,
                start_new_session=True)  # its own process group: it can be frozen with its workers
        handle = SupervisorHandle(number, popen, log_path, psutil.Process(popen.pid), lenient=lenient,
                                  skew_ms=skew_ms, import_delay_ms=import_delay_ms, host=host,
                                  wall_skew_ms=wall_skew_ms)
        self.handles.append(handle)
        where = {"host": host.index, "wall_skew_ms": wall_skew_ms} if host is not None else {}
        self._note("start", handle, lenient=lenient, skew_ms=skew_ms, import_delay_ms=import_delay_ms, **where)
        return handle

    def replace(self, handle: SupervisorHandle, **kwargs) -> SupervisorHandle:
        """A new supervisor in place of `handle` (which was killed or told to stop): as lenient, and
        on the same host."""
        return self.start_one(lenient=handle.lenient, host=handle.host, **kwargs)

    def members(self) -> list[SupervisorHandle]:
        """Supervisors that are, or will be again, supervising: running or frozen."""
        return [h for h in self.handles if h.state in (RUNNING, FROZEN)]

    def running(self) -> list[SupervisorHandle]:
        return [h for h in self.handles if h.state == RUNNING]

    def ensure(self, count: int) -> None:
        """`count` members; with hosts, one on each host."""
        if self.hosts:
            served = {h.host.index for h in self.members()}
            for host in self.hosts:
                if host.index not in served:
                    self.start_one(host=host)
            return
        while len(self.members()) < count:
            self.start_one()

    def kill(self, handle: SupervisorHandle) -> None:
        handle.workers()
        faults.kill(handle.process)
        handle.state = KILLED

    def terminate(self, handle: SupervisorHandle) -> None:
        handle.workers()
        faults.send(handle.process, signal.SIGTERM)
        handle.state = STOPPING
        handle.stop_deadline = time.monotonic() + self.config.grace_ms / 1000 + STOP_PATIENCE_S

    def reap(self) -> None:
        """Notice supervisors that ended, judge how, and check that their workers went with them."""
        now = time.monotonic()
        for h in self.handles:
            if h.state == EXITED:
                continue
            if h.state == RUNNING and now - h.listed_at > 1.0:
                h.workers()  # remember the workers, for the orphan check if it dies
                h.listed_at = now
            code = h.popen.poll()
            if code is None:
                if h.state == STOPPING and now > h.stop_deadline:
                    self.anomaly("supervisor_hung", f"supervisor {h.number} (pid {h.pid}) did not stop within"
                                 f" {self.config.grace_ms / 1000 + STOP_PATIENCE_S:.0f} s of SIGTERM;"
                                 f" killed. Log: {h.log_tail()}")
                    faults.signal_group(h.pid, signal.SIGKILL)
                    h.state = KILLED
                continue
            if h.state == STOPPING and code != 0:
                self.anomaly("supervisor_exit", f"supervisor {h.number} (pid {h.pid}) exited with code {code}"
                             f" after SIGTERM. Log: {h.log_tail()}")
            elif h.state in (RUNNING, FROZEN):
                self.anomaly("supervisor_crashed", f"supervisor {h.number} (pid {h.pid}) exited by itself with"
                             f" code {code}. Log: {h.log_tail()}")
            how = {KILLED: "killed", STOPPING: "stopped"}.get(h.state, "crashed")
            self.exits[how] = self.exits.get(how, 0) + 1
            h.state = EXITED
            self._note("exit", h, how=how, code=code)
            self._orphan_checks.append((now + ORPHAN_GRACE_S, h))
        due = [(t, h) for t, h in self._orphan_checks if t <= now]
        self._orphan_checks = [(t, h) for t, h in self._orphan_checks if t > now]
        for _, h in due:
            self._check_orphans(h)

    def _check_orphans(self, h: SupervisorHandle) -> None:
        left = [p for p in h.workers_seen.values() if faults.alive(p)]
        for p in left:
            self.anomaly("orphan_survived", f"worker pid {p.pid} of supervisor {h.number} still runs"
                         f" {ORPHAN_GRACE_S:.0f} s after its supervisor ended; killed")
            faults.kill(p)

    def stop_all(self) -> None:
        """SIGTERM every supervisor, wait for each (a frozen one is thawed first), then check
        that every worker is gone."""
        for h in self.handles:
            if h.state == FROZEN:
                faults.signal_group(h.pid, signal.SIGCONT)
                h.state = RUNNING
            if h.state == RUNNING:
                started = time.monotonic() + STARTUP_PATIENCE_S
                while not h.started_up() and h.popen.poll() is None and time.monotonic() < started:
                    time.sleep(TICK_S)  # a supervisor started moments ago: let it install its handler
                self.terminate(h)
        deadline = time.monotonic() + self.config.grace_ms / 1000 + STOP_PATIENCE_S + 1
        while any(h.state not in (EXITED,) and h.popen.poll() is None for h in self.handles):
            if time.monotonic() > deadline:
                break
            self.reap()
            time.sleep(TICK_S)
        self.reap()
        for _, h in self._orphan_checks:
            wait_until = time.monotonic() + ORPHAN_GRACE_S
            while any(faults.alive(p) for p in h.workers_seen.values()) and time.monotonic() < wait_until:
                time.sleep(TICK_S)
            self._check_orphans(h)
        self._orphan_checks = []

    def kill_all(self) -> None:
        """Last resort (an interrupted run): nothing of the fleet survives."""
        for h in self.handles:
            faults.signal_group(h.pid, signal.SIGCONT)
            faults.signal_group(h.pid, signal.SIGKILL)
            for p in h.workers_seen.values():
                faults.kill(p)
            try:
                h.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if h.state != EXITED:
                self._note("exit", h, how="killed at the end", code=h.popen.returncode)
                h.state = EXITED
        self._journal.close()
