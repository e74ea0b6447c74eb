"""A user whose `/tmp/yieldstar-<uid>` another local user made first (a service, a cron job or
ssh without a login session has no XDG_RUNTIME_DIR): every operation that committed succeeds,
and its news travel through the user's home folder, or, without one, are replaced by polling.

The multi-process tests run the victim's processes as a throwaway second user, and the squatted
folder is made by a throwaway third one (both removed at the end, whatever happens); they need
root (CI runs as root) and are skipped without it, failed under CI=true. The victim runs
`setpriv --reuid ... -- env -i ...` (no PAM session, no XDG_RUNTIME_DIR, none of root's
environment). Where the interpreter or this checkout lies below a folder other users may not
enter (a pyenv Python under /root), the victim's processes get the one capability that lets them
reach them, CAP_DAC_READ_SEARCH (read and search anything), inherited by the supervisor's
workers: what is under test does not change with it, since the choice of the socket folder reads
owners and modes, and making a folder, binding or sending to a socket need write permission,
which the capability does not grant.

The tests of the choice itself (`socket_folder.choose`) need no second user: they hand it
stand-ins for /run/user, /tmp and the home, in a folder short enough for socket paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from faults import HEARTBEAT_MS, LEASE_MS, RENEW_MS, ROOT, TESTS, SupervisorProcess, gone, needs, wait_gone, wait_until
from supervisor import Completed, open_backend
from supervisor.ledger.sqlite import nudge
from supervisor.ledger.sqlite.socket_folder import FOLDER_MAX, NoPrivateFolder, choose, describe
from worker import Client, WorkflowCancelled
from worker import client as client_module

pytestmark = pytest.mark.usefixtures("dump_on_hang")

NEIGHBOURS_APP = str(TESTS / "apps" / "neighbours_app.py")
FIX = "set XDG_RUNTIME_DIR to a private folder"  # the fix the one warning gives
NEVER_POLL_MS = 600_000  # longer than any test: a supervisor these tests see wake was nudged
NEVER_POLL_S = 600.0  # the same for a client's result() (its default poll is worker.client.POLL_S)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the choice of the folder, with stand-ins for the system's folders -----------------------------


@pytest.fixture
def places():
    """A short folder (socket paths are at most 107 bytes: tmp_path is too deep) holding
    stand-ins for /run/user (without this user's folder), /tmp (sticky) and a private home."""
    base = Path(tempfile.mkdtemp(prefix="ys-", dir="/tmp"))
    try:
        (base / "run").mkdir(0o755)
        (base / "tmp").mkdir()
        os.chmod(base / "tmp", 0o1777)
        (base / "home").mkdir(0o700)
        yield base
    finally:
        shutil.rmtree(base)


def choose_in(base: Path, *, environ: Optional[dict] = None, home: Optional[Path] = None, uid: Optional[int] = None):
    return choose(os.geteuid() if uid is None else uid, environ or {}, str(home) if home else None,
                  run_user=str(base / "run"), tmp=str(base / "tmp"))


@pytest.mark.timeout(30)
def test_without_a_runtime_folder_the_home_folder_is_taken(places):
    choice = choose_in(places, home=places / "home")
    assert choice.folder == str(places / "home" / ".yieldstar")
    assert mode(choice.folder) == 0o700 and os.lstat(choice.folder).st_uid == os.geteuid()
    assert [p.why for p in choice.passed_over] == [f"{places}/run/{os.geteuid()} does not exist"]
    assert not os.path.exists(places / "tmp" / f"yieldstar-{os.geteuid()}")


@pytest.mark.timeout(30)
def test_the_runtime_folder_comes_first_and_run_user_finds_it_without_the_variable(places):
    runtime = places / "run" / str(os.geteuid())
    runtime.mkdir(0o700)
    with_variable = choose_in(places, environ={"XDG_RUNTIME_DIR": str(runtime)}, home=places / "home")
    without = choose_in(places, home=places / "home")  # a cron job of the same user
    assert with_variable.folder == without.folder == str(runtime / "yieldstar")
    assert with_variable.passed_over == without.passed_over == ()
    assert not os.path.exists(places / "home" / ".yieldstar")


@pytest.mark.timeout(30)
def test_a_relative_or_too_long_runtime_folder_is_passed_over(places):
    long = places / ("x" * (FOLDER_MAX - len(str(places)) - len("/yieldstar")))  # one byte too long
    long.mkdir(0o700)
    for runtime in ("relative/run", str(long)):
        choice = choose_in(places, environ={"XDG_RUNTIME_DIR": runtime}, home=places / "home")
        assert choice.folder == str(places / "home" / ".yieldstar"), choice
        assert ("not an absolute path" if runtime.startswith("relative") else "too long") in choice.passed_over[0].why
    assert len(os.fsencode(str(long / "yieldstar"))) == FOLDER_MAX + 1
    assert not os.path.exists(long / "yieldstar")


@pytest.mark.timeout(30)
def test_a_home_too_deep_for_socket_paths_is_passed_over(places):
    home = places / "home" / ("d" * 40)
    home.mkdir(0o700)
    choice = choose_in(places, home=home)
    assert choice.folder == str(places / "tmp" / f"yieldstar-{os.geteuid()}")
    assert "too long for socket paths" in choice.passed_over[-1].why
    assert not os.path.exists(home / ".yieldstar")


@pytest.mark.timeout(30)
def test_a_planted_symlink_is_refused_and_never_followed(places):
    uid = os.geteuid()
    elsewhere = places / "elsewhere"
    elsewhere.mkdir(0o700)
    (places / "home" / ".yieldstar").symlink_to(elsewhere)
    choice = choose_in(places, home=places / "home")
    assert choice.folder == str(places / "tmp" / f"yieldstar-{uid}")  # the next candidate
    assert choice.passed_over[-1].why == f"{places}/home/.yieldstar is a symlink"

    os.rmdir(choice.folder)
    (places / "tmp" / f"yieldstar-{uid}").symlink_to(places / "nowhere")  # dangling: made where it points?
    choice = choose_in(places, home=places / "home")
    assert choice.folder is None
    assert [p.why for p in choice.passed_over][-2:] == [f"{places}/home/.yieldstar is a symlink",
                                                        f"{places}/tmp/yieldstar-{uid} is a symlink"]
    assert os.listdir(elsewhere) == [] and not os.path.lexists(places / "nowhere")
    warning = describe(choice)
    assert f"remove {places}/tmp/yieldstar-{uid}, or {FIX}" in warning, warning


@pytest.mark.timeout(30)
@pytest.mark.parametrize("home_mode", [0o770, 0o707, 0o777, 0o1777], ids=oct)
def test_a_home_other_users_may_write_is_passed_over(places, home_mode):
    home = places / "home"
    os.chmod(home, home_mode)
    choice = choose_in(places, home=home)
    assert choice.folder == str(places / "tmp" / f"yieldstar-{os.geteuid()}")
    assert choice.passed_over[-1].why == f"the home {home} may be written by other users (mode {home_mode:04o})"
    assert not os.path.exists(home / ".yieldstar")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("above_mode, taken", [(0o777, False), (0o1777, True), (0o755, True)],
                         ids=["0o777 refused", "0o1777 sticky", "0o755"])
def test_a_folder_above_the_home_that_others_may_write_unless_sticky_is_refused(places, above_mode, taken):
    above = places / "above"
    above.mkdir()
    os.chmod(above, above_mode)
    (above / "home").mkdir(0o700)
    choice = choose_in(places, home=above / "home")
    if taken:
        assert choice.folder == str(above / "home" / ".yieldstar")
    else:
        assert choice.folder == str(places / "tmp" / f"yieldstar-{os.geteuid()}")
        assert choice.passed_over[-1].why == f"{above} may be written by other users (mode 0777)"


@pytest.mark.timeout(30)
def test_a_folder_another_user_made_is_refused_and_the_warning_says_how_to_fix_it(places):
    needs(None if os.geteuid() == 0 else "giving a folder to another owner needs root", "test of a squatted folder")
    uid, other = os.geteuid(), 4_000_000  # no user needed: an owner is a number
    squatted = places / "tmp" / f"yieldstar-{uid}"
    squatted.mkdir(0o700)
    os.chown(squatted, other, other)
    (places / "home" / ".yieldstar").mkdir(0o700)
    os.chown(places / "home" / ".yieldstar", other, other)
    choice = choose_in(places, home=places / "home")
    assert choice.folder is None
    assert [p.why for p in choice.passed_over] == [
        f"{places}/run/{uid} does not exist",
        f"{places}/home/.yieldstar was made by uid {other}, not by this user",
        f"{squatted} was made by uid {other}, not by this user",
    ]
    warning = describe(choice)
    assert warning.startswith(f"no private folder for this user's sockets: {squatted} was made by uid {other}, not"
                              f" by this user; remove {squatted}, or {FIX} of this user (passed over too: ")
    assert warning.endswith("find new work and outcomes by polling")
    assert os.listdir(squatted) == []


@pytest.mark.timeout(30)
def test_a_folder_of_this_user_open_to_others_is_refused_with_chmod_as_the_fix(places):
    folder = places / "tmp" / f"yieldstar-{os.geteuid()}"
    folder.mkdir()
    os.chmod(folder, 0o755)
    choice = choose_in(places)
    assert choice.folder is None
    assert f"{folder} is open to other users (mode 0755); chmod 700 {folder}, or {FIX}" in describe(choice)


# -- without a folder, in one process --------------------------------------------------------------

@pytest.fixture
def no_private_folder(monkeypatch):
    """This process behaves as a user without a private folder (its choice is made once per
    process: `nudge_dir` caches it per ledger, so the cache is emptied before and after)."""
    def squatted() -> str:
        raise NoPrivateFolder("no private folder for this user's sockets: /tmp/yieldstar-0 was made by uid 7")

    nudge.nudge_dir.cache_clear()
    monkeypatch.setattr(nudge, "socket_root", squatted)
    monkeypatch.setattr(client_module, "_told_polling", False)
    yield
    nudge.nudge_dir.cache_clear()


@pytest.mark.timeout(30)
def test_without_a_folder_every_commit_succeeds_and_waits_poll(tmp_path, no_private_folder, caplog):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("one", "w", "null")  # nudges
        (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
        assert backend.executions.acknowledge(lease, Completed('"done"')) == Completed('"done"')  # announces
        with pytest.raises(OSError, match="no private folder"):
            backend.listen_for_due()  # the supervisor logs it and polls (see `Supervisor.run`)
    with Client(db, poll_s=0.05) as client, Client(db, poll_s=0.05) as another:
        handle = client.start("w", 1)  # once, without an id: it does not raise after admitting
        assert client.handle("one").result(timeout=10) == "done"
        assert another.handle("one").result(timeout=10) == "done"
        another.handle(handle.execution_id).cancel("by hand")
        with pytest.raises(WorkflowCancelled):
            handle.result(timeout=10)  # found by the poll
    told = [r.getMessage() for r in caplog.records if r.name == "yieldstar.client"]
    assert told == ["no outcome socket (no private folder for this user's sockets: /tmp/yieldstar-0 was made by"
                    " uid 7): result() finds outcomes by polling every 0.05 s"], told  # once for two clients


# -- a second local user -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int
    home: str


def add_user(kind: str, *, home: bool) -> LocalUser:
    name = f"ys-{kind}-{secrets.token_hex(4)}"
    where = ["--create-home", "--home-dir", f"/home/{name}"] if home else ["--no-create-home", "--home-dir",
                                                                           "/nonexistent"]
    subprocess.run(["useradd", "--user-group", *where, name], check=True, capture_output=True, text=True, timeout=60)
    entry = pwd.getpwnam(name)
    return LocalUser(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def remove_user(user: LocalUser) -> None:
    subprocess.run(["userdel", "--remove", user.name], capture_output=True, timeout=60)  # no home: a warning
    if user.home != "/nonexistent" and os.path.lexists(user.home):
        shutil.rmtree(user.home)


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def as_user(user: LocalUser) -> list[str]:
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]


CAN_REACH = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]  # see the module


@dataclass
class Victim:
    """The user whose /tmp folder was squatted, and the processes the test runs as that user."""

    user: LocalUser
    attacker: LocalUser
    folder: Path  # the victim's own (0700): its ledger and files
    logs: Path  # the test's: where the victim's processes' output goes
    runner: list[str] = field(default_factory=list)
    supervisors: list[SupervisorProcess] = field(default_factory=list)
    others: list[subprocess.Popen] = field(default_factory=list)

    @property
    def db(self) -> Path:
        return self.folder / "ledger.db"

    @property
    def squatted(self) -> Path:
        return Path(f"/tmp/yieldstar-{self.user.uid}")

    def command(self, *args: str) -> list[str]:
        return [*self.runner, sys.executable, *args]

    def environment(self) -> list[str]:
        return ["env", "-i", f"HOME={self.user.home}", f"USER={self.user.name}", f"LOGNAME={self.user.name}",
                "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", f"PYTHONPATH={ROOT}", "PYTHONDONTWRITEBYTECODE=1"]

    def python(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.folder)

    def yieldstar(self, *args: str) -> subprocess.CompletedProcess:
        return self.python("-m", "supervisor.cli", "--db", str(self.db), *args)

    def spawn(self, *args: str, name: str) -> tuple[subprocess.Popen, Path, Path]:
        """A process of the victim in the background, its stdout and stderr in files."""
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            popen = subprocess.Popen(self.command(*args), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                     cwd=self.folder, start_new_session=True)
        self.others.append(popen)
        return popen, out, err

    def supervise(self, app: str, *, poll_ms: int, concurrency: int = 1) -> SupervisorProcess:
        args = self.command("-m", "supervisor.cli", "--db", str(self.db), "supervise", app, "--concurrency",
                            str(concurrency), "--lease-ms", str(LEASE_MS), "--renew-ms", str(RENEW_MS),
                            "--heartbeat-ms", str(HEARTBEAT_MS), "--poll-ms", str(poll_ms))
        log_path = self.logs / f"supervisor-{len(self.supervisors) + 1}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.folder, start_new_session=True)
        process = SupervisorProcess(popen, log_path, concurrency)
        self.supervisors.append(process)
        process.wait_ready()
        return process

    def stop_everything(self) -> None:
        for process in self.supervisors:
            print(f"---- supervisor pid {process.pid} (exit {process.popen.returncode}) ----\n{process.log()}")
            process.kill_everything()
        for popen in self.others:
            if popen.poll() is None:
                os.killpg(popen.pid, 9)
                popen.wait(10)
        pids = [pid for p in self.supervisors for pid in p.seen_pids | {p.pid}] + [p.pid for p in self.others]
        wait_gone(pids)


def reach(victim: Victim) -> list[str]:
    """How to run the victim's Python on this checkout: as the victim alone, or with the one
    capability that lets it reach an interpreter or checkout below a folder only root may enter."""
    probe = [sys.executable, "-c", "import click, psutil, supervisor, worker"]
    tried = []
    for extra in ([], CAN_REACH):
        runner = [*as_user(victim.user), *extra, "--", *victim.environment()]
        result = subprocess.run([*runner, *probe], capture_output=True, text=True, timeout=60, cwd=victim.folder)
        if result.returncode == 0:
            return runner
        tried.append(f"{' '.join(extra) or 'as is'}: exit {result.returncode}: {result.stderr.strip()[-300:]}")
    needs(f"user {victim.user.name} cannot run {sys.executable} on {ROOT} ({'; '.join(tried)}): run the tests from"
          " a checkout and an interpreter that other users may reach (o+x on every folder above them)",
          "tests as a second local user")
    raise AssertionError("unreachable")  # pragma: no cover - needs() skipped or failed


@pytest.fixture
def victim(request, tmp_path):
    """A throwaway user whose /tmp/yieldstar-<uid> a throwaway attacker made first;
    `request.param`: ("home" or "no home", the mode of the squatted folder)."""
    why = None if os.geteuid() == 0 else "making local users needs root"
    missing = [tool for tool in ("useradd", "userdel", "setpriv") if shutil.which(tool) is None]
    needs(why or (f"{', '.join(missing)} not found" if missing else None), "tests as a second local user")
    with_home, squat_mode = request.param[0] == "home", request.param[1]
    users: list[LocalUser] = []
    made: list[Path] = []
    victim = None
    try:
        attacker = add_user("a", home=False)
        users.append(attacker)
        user = add_user("v", home=with_home)
        users.append(user)
        assert not os.path.exists(f"/run/user/{user.uid}"), "a fresh user has no login session"
        assert with_home == os.path.isdir(user.home), user
        folder = Path(tempfile.mkdtemp(prefix="ys-victim-", dir="/tmp"))
        made.append(folder)
        os.chown(folder, user.uid, user.gid)
        victim = Victim(user, attacker, folder, tmp_path)
        made.append(victim.squatted)
        if os.path.lexists(victim.squatted):  # left by a user of the same uid, long gone
            shutil.rmtree(victim.squatted)
        subprocess.run([*as_user(attacker), "--", "mkdir", "-m", f"{squat_mode:o}", str(victim.squatted)],
                       check=True, capture_output=True, timeout=60)
        assert os.stat(victim.squatted).st_uid == attacker.uid and mode(victim.squatted) == squat_mode
        victim.runner = reach(victim)
        yield victim
    finally:
        if victim is not None:
            victim.stop_everything()
        for user in reversed(users):
            remove_user(user)
        for path in made:
            if os.path.lexists(path):
                shutil.rmtree(path)
        left = [user.name for user in users if user_exists(user.name)]
        assert not left, f"users left behind: {left}"


def squat_warnings(text: str) -> int:
    return text.count(FIX)


def nudge_folder(victim: Victim) -> Path:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(victim.db))).hexdigest()[:24]
    return Path(victim.user.home) / ".yieldstar" / digest


def ledger_rows(victim: Victim) -> list[tuple[str, str, str]]:
    """(execution_id, workflow, status) of every execution, read by the victim (a root process
    would leave root's -shm beside the victim's ledger, which the victim then refuses)."""
    result = victim.python("-c", "import json, sqlite3, sys; print(json.dumps(sqlite3.connect(sys.argv[1]).execute("
                                 "'SELECT execution_id, workflow, status FROM executions ORDER BY rowid')"
                                 ".fetchall()))", str(victim.db))
    assert result.returncode == 0, result.stderr
    return [tuple(row) for row in json.loads(result.stdout)]


START_ONCE = """
import sys
from worker import Client
with Client(sys.argv[1]) as client:
    print(client.start(sys.argv[2], {"marker": sys.argv[3], "log": sys.argv[4], "order": 1}).execution_id)
"""

# Start `workflow` with `input`, then wait for its result; prints "waiting <id>" once the waiter
# has had its first look (from then on only an announcement or a poll can end the wait), then
# the result and when the wait ended (time.monotonic(), the same clock in every process).
START_AND_WAIT = """
import json, sys, time
from worker import Client
db, workflow, input_json, poll_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with Client(db, poll_s=poll_s) as client:
    handle = client.start(workflow, json.loads(input_json))
    get = client.backend.executions.get
    def get_and_tell(execution_id):
        record = get(execution_id)
        client.backend.executions.get = get
        print("waiting", handle.execution_id, flush=True)
        return record
    client.backend.executions.get = get_and_tell
    result = handle.result(timeout=90)
    print(json.dumps({"result": result, "ended_at": time.monotonic()}), flush=True)
"""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [("no home", 0o700), ("no home", 0o777)], indirect=True,
                         ids=["squatted 0700", "squatted 0777"])
def test_a_start_without_an_id_returns_once_and_admits_one_execution(victim):
    marker = victim.folder / "marker"
    result = victim.python("-c", START_ONCE, str(victim.db), "nb.child", str(marker), str(victim.folder / "log"))
    assert result.returncode == 0, result.stderr
    (first,) = result.stdout.split()
    assert squat_warnings(result.stderr) == 1, result.stderr
    assert f"{victim.squatted} was made by user {victim.attacker.name} (uid {victim.attacker.uid})" in result.stderr
    assert f"remove {victim.squatted}, or {FIX}" in result.stderr

    result = victim.yieldstar("start", "nb.child", "--input", json.dumps({"marker": "m", "log": "l", "order": 2}))
    assert result.returncode == 0, result.stderr
    (second,) = result.stdout.split()
    assert squat_warnings(result.stderr) == 1, result.stderr
    assert ledger_rows(victim) == [(first, "nb.child", "admitted"), (second, "nb.child", "admitted")]
    assert os.listdir(victim.squatted) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [("no home", 0o700)], indirect=True, ids=["squatted 0700"])
def test_without_a_folder_a_supervisor_runs_a_parent_and_its_child_and_results_are_polled(victim):
    supervisor = victim.supervise(NEIGHBOURS_APP, poll_ms=100, concurrency=2)
    marker, log = victim.folder / "marker", victim.folder / "events"
    marker.touch()  # the child need not wait
    child = {"marker": str(marker), "log": str(log), "order": 7}
    client, out, err = victim.spawn("-c", START_AND_WAIT, str(victim.db), "nb.parent", json.dumps({"child": child}),
                                    str(client_module.POLL_S), name="client")
    assert client.wait(120) == 0, err.read_text()
    ended = json.loads(lines(out)[-1])
    assert ended["result"]["result"] == {"packed": 7}, ended  # ctx.start did not fail the parent
    parent_id = lines(out)[0].split()[1]
    assert (parent_id, "nb.parent", "completed") in ledger_rows(victim)
    assert squat_warnings(err.read_text()) == 1, err.read_text()
    assert "no outcome socket" in err.read_text()

    # It acknowledged two executions that ended, and is still running: it exits 0 when told to.
    supervisor.wait_log("outcome=completed", timeout=30, count=2)
    assert supervisor.popen.poll() is None, supervisor.log()
    supervisor.signal(15)
    assert supervisor.wait(60) == 0, supervisor.log()
    text = supervisor.log()
    assert squat_warnings(text) == 1, text  # once, in the supervisor, for it and its workers
    assert f"{victim.squatted} was made by user {victim.attacker.name}" in text
    assert f"remove {victim.squatted}, or {FIX}" in text
    assert "new work is found by polling every 100 ms" in text
    assert "Traceback" not in text and "PermissionError" not in text, text
    assert os.listdir(victim.squatted) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [("home", 0o700)], indirect=True, ids=["squatted 0700"])
def test_with_a_home_nudges_and_announcements_travel_through_it(victim):
    supervisor = victim.supervise(NEIGHBOURS_APP, poll_ms=NEVER_POLL_MS)
    folder = nudge_folder(victim)
    assert stat.S_ISSOCK(os.lstat(folder / f"{supervisor.pid}.sock").st_mode)
    assert mode(folder.parent) == mode(folder) == 0o700 and os.lstat(folder.parent).st_uid == victim.user.uid
    marker, log = victim.folder / "marker", victim.folder / "events"
    marker.touch()

    def started_and_done(execution_id: str) -> float:
        """Start `execution_id` from the command line; seconds from its exit to its delivery's end."""
        result = victim.yieldstar("start", "nb.child", "--id", execution_id, "--input",
                                  json.dumps({"marker": str(marker), "log": str(log), "order": 1}))
        assert result.returncode == 0 and result.stderr == "", result.stderr
        admitted = time.monotonic()
        supervisor.wait_log(f"delivery execution={execution_id} token=1 outcome=completed", timeout=60)
        return time.monotonic() - admitted

    started_and_done("first")  # perhaps found by the supervisor's first claim; then it is idle
    assert started_and_done("second") < 10, supervisor.log()  # its next poll is 10 minutes away

    marker.unlink()  # the next child waits in its step for the marker
    client, out, err = victim.spawn("-c", START_AND_WAIT, str(victim.db), "nb.child",
                                    json.dumps({"marker": str(marker), "log": str(log), "order": 3}),
                                    str(NEVER_POLL_S), name="client")
    wait_until(lambda: lines(out), timeout=60, message=f"the client to wait: {err.read_text()}")
    outcomes = list((folder / "outcomes").iterdir())
    assert [p.name for p in outcomes] == [f"{client.pid}-1.sock"]
    marker.touch()
    touched = time.monotonic()
    assert client.wait(60) == 0, err.read_text()
    ended = json.loads(lines(out)[-1])
    assert ended["result"] == {"packed": 3}
    assert ended["ended_at"] - touched < 10  # woken by the announcement: its poll is 10 minutes away
    assert err.read_text() == ""
    supervisor.signal(15)
    assert supervisor.wait(60) == 0, supervisor.log()
    assert squat_warnings(supervisor.log()) == 0 and "no nudge socket" not in supervisor.log(), supervisor.log()
    assert os.listdir(victim.squatted) == []
    assert all(gone(pid) for pid in supervisor.seen_pids)
