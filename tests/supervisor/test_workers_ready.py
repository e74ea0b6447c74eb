"""A supervisor at its largest process count is up within seconds, and says how many workers are.

Its workers are forked from a template process that imported the runtime and the app once
(`worker._runtime.template`); each is still the supervisor's own child, with its own pipe, dies
with the supervisor, and is replaced when it dies. Where no template can be used (an app that
starts a thread when imported), or once the template died, workers are fresh interpreters, as
before. Each test runs `yieldstar supervise` as a user does.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from faults import admit, wait_gone, wait_until
from supervisor import open_backend
from supervisor.pool import BOOT, is_worker_command
from worker._runtime.template import TEMPLATE_FLAG

THREAD_ON_IMPORT_APP = '''
import threading

from worker import workflow

threading.Thread(target=threading.Event().wait, daemon=True).start()  # a client library's pool, say


@workflow("threads.echo")
def echo(ctx, input):
    return ctx.run("echo", lambda: input)
'''

ORPHAN_APP = """
import subprocess
import sys
import time

from worker import workflow


def start_a_subprocess_and_hang(path, seconds):
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    with open(path, "w") as file:
        file.write(str(child.pid))
    time.sleep(3600)


@workflow("orphans.leave")
def leave(ctx, input):
    return ctx.run("start", start_a_subprocess_and_hang, input["path"], input["seconds"])
"""


def children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children()


def template_of(supervisor) -> list[int]:
    """The pid of the supervisor's template process, if it has one."""
    found = []
    for process in children(supervisor.pid):
        try:
            if process.cmdline()[1:3] == [BOOT, TEMPLATE_FLAG]:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def completed(db, execution_id: str) -> bool:
    with open_backend(db) as backend:
        return backend.executions.get(execution_id).status == "completed"


def delivers(db, execution_id: str, workflow: str = "sv.noop3", input=None) -> None:
    """Admit an execution and wait until a worker has run it to completion."""
    admit(db, execution_id, workflow, input)
    wait_until(lambda: completed(db, execution_id), timeout=15, message=f"{execution_id} delivered and completed")


def supervised_app(tmp_path, name: str, source: str) -> str:
    app = tmp_path / name
    app.write_text(source)
    return str(app)


@pytest.mark.timeout(180)
def test_a_supervisor_of_256_workers_has_them_all_up_within_seconds_and_its_summary_line_says_so(tmp_path,
                                                                                                 supervisors):
    db = tmp_path / "ledger.db"
    started = time.monotonic()
    # The default timings: 256 workers beaten every 200 ms (the other tests' pace) keep a loaded
    # two-core machine busy with heartbeats alone.
    supervisor = supervisors.start(db, workers=256, concurrency=1024, lease_ms=30_000, renew_ms=10_000,
                                   heartbeat_ms=1000, extra=["--summary", "0.5"], ready=False)
    # Fresh interpreters took half a minute and more on two busy cores; forks of the template take seconds.
    supervisor.wait_log("workers 256/256 up", timeout=30)
    assert time.monotonic() - started < 30
    assert re.search(r"worker deaths 0  workers 256/256 up", supervisor.wait_log("  workers 256/256 up", timeout=5))
    workers = supervisor.workers()
    assert len(workers) == 256
    # Each its own process, and the supervisor's child (not the template's): its parent-death
    # signal and checks watch the supervisor.
    assert {p.pid for p in children(supervisor.pid) if is_worker_command(p.cmdline())} == set(workers)
    assert len(template_of(supervisor)) == 1
    delivers(db, "after-the-start")


@pytest.mark.timeout(120)
def test_killing_the_supervisor_leaves_no_worker_nor_template_behind(tmp_path, supervisors):
    db = tmp_path / "ledger.db"
    supervisor = supervisors.start(db, workers=64, concurrency=64, lease_ms=30_000, renew_ms=10_000,
                                   heartbeat_ms=1000, ready=False)
    supervisor.wait_log("workers 64/64 up", timeout=30)
    processes = supervisor.workers() + template_of(supervisor)
    assert len(processes) == 65
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait()
    wait_gone(processes, timeout=10)  # each killed by the kernel at its parent's death, template too


@pytest.mark.timeout(120)
def test_workers_outlive_a_killed_template_and_a_killed_worker_is_still_replaced(tmp_path, supervisors):
    db = tmp_path / "ledger.db"
    supervisor = supervisors.start(db, workers=4, concurrency=4)
    supervisor.wait_log("workers 4/4 up")
    [template] = template_of(supervisor)
    workers = supervisor.workers()
    os.kill(template, signal.SIGKILL)
    wait_gone([template])
    victim = workers[0]
    os.kill(victim, signal.SIGKILL)
    supervisor.wait_log(f"idle worker pid {victim} killed by SIGKILL; replacing it")
    # The others ran on; the replacement is a fresh interpreter, the template being gone.
    wait_until(lambda: (now := supervisor.workers()) and len(now) == 4 and victim not in now and now,
               message="the killed worker replaced")
    assert set(workers[1:]) <= set(supervisor.workers())
    supervisor.wait_log("the template process failed")
    delivers(db, "after-the-template")


@pytest.mark.timeout(120)
def test_an_app_that_starts_a_thread_when_imported_gets_fresh_interpreters_not_forks(tmp_path, supervisors):
    db = tmp_path / "ledger.db"
    app = supervised_app(tmp_path, "threads_app.py", THREAD_ON_IMPORT_APP)
    supervisor = supervisors.start(db, app=app, workers=3, concurrency=3)
    supervisor.wait_log("workers 3/3 up")
    assert "workers cannot be forked from a template process" in supervisor.log()
    assert template_of(supervisor) == []
    delivers(db, "threaded", "threads.echo", 7)


@pytest.mark.timeout(120)
def test_the_subprocess_a_killed_worker_leaves_is_adopted_by_its_supervisor_and_waited_for(tmp_path, supervisors):
    db = tmp_path / "ledger.db"
    supervisor = supervisors.start(db, app=supervised_app(tmp_path, "orphans_app.py", ORPHAN_APP), concurrency=1)
    pid_file = tmp_path / "orphan.pid"
    admit(db, "orphan", "orphans.leave", {"path": str(pid_file), "seconds": 3})
    orphan = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), message="the step's subprocess"))
    [worker] = supervisor.workers()
    os.kill(worker, signal.SIGKILL)
    # The supervisor is the child subreaper of what it starts (that is how it adopts its forked
    # workers): the orphan is its child now, not init's ...
    assert wait_until(lambda: psutil.Process(orphan).ppid() == supervisor.pid, message="the orphan adopted")
    # ... and once the orphan exited, it is waited for: no zombie is left behind.
    wait_until(lambda: not psutil.pid_exists(orphan), timeout=30, message="the orphan waited for")


@pytest.mark.timeout(120)
def test_a_template_killed_while_it_imports_the_app_leaves_the_workers_to_fresh_interpreters(tmp_path, supervisors):
    db = tmp_path / "ledger.db"
    supervisor = supervisors.start(db, concurrency=2, env={"SV_IMPORT_DELAY_S": "2"}, ready=False)
    [template] = wait_until(lambda: template_of(supervisor), message="the template importing the app")
    os.kill(template, signal.SIGKILL)
    supervisor.wait_log("the template process died while importing the app (killed by SIGKILL): each worker is"
                        " started as a fresh interpreter")
    supervisor.wait_log("workers 2/2 up", timeout=30)
    delivers(db, "no-template")
