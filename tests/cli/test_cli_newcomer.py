"""What a newcomer meets first, done right (issue 11's newcomer defects), each with a real process.

- an app that cannot be loaded is one line naming the app and the cause, exit 2, no traceback
  (`--verbose` adds it), and no ledger file; the app is loaded before the ledger is opened;
- `start --input @FILE` and `--input -`; `--version`; a closed pipe and Ctrl-C end quietly;
- one error style and one exit code per kind of error, click's usage errors included;
- stale nudge sockets of dead supervisors are swept; `--db` help shows the default in effect;
- the README's unit test names the test extras; `chaos` explains its progress line and says
  where it wrote its report; `settle` of an effect nobody has begun needs `--create`;
- `supervise` keeps a live status line on a terminal (driven in a pseudo-terminal).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faults import APP, ROOT, TESTS, admit, cli, wait_gone, wait_until
from supervisor import open_backend
from supervisor.ledger.sqlite.nudge import nudge_dir

pytestmark = pytest.mark.usefixtures("dump_on_hang")

BROKEN = TESTS / "apps" / "broken"


def yieldstar(*args: str, cwd=ROOT, env: dict | None = None, input: str | None = None,
              timeout: float = 30.0) -> subprocess.CompletedProcess:
    """One `yieldstar ...` command (no implicit --db), run from `cwd`."""
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL,
                          env=env)


def ledger_files(db: Path) -> list[Path]:
    return [p for p in (Path(f"{db}{suffix}") for suffix in ("", "-wal", "-shm")) if p.exists()]


# -- 1. an app that cannot be loaded ------------------------------------------------------------

def _syntax_error_app(tmp_path: Path) -> str:
    # Written here, not kept in the tree, where every linter and compiler would trip on it.
    path = tmp_path / "half_edited.py"
    path.write_text('"""An app with a syntax error on line 4."""\n\ndef order(ctx, input):\n    return (input\n')
    return str(path)


LOAD_FAILURES = {
    # case: (APP as typed, a piece of the one line that names the cause)
    "missing file": ("tests/apps/no_such_app.py", "does not exist"),
    "syntax error": (None, "SyntaxError: "),
    "import error": ("tests/apps/broken/import_error.py",
                     ("ModuleNotFoundError: No module named 'yieldstar_no_such_library'"
                      " (import_error.py, line 3)")),
    "exception on import": ("tests/apps/broken/raises.py", "RuntimeError: SHOP_API_KEY is not set (raises.py, line 3)"),
    "sys.exit on import": ("tests/apps/broken/exits.py", "it called sys.exit(3) while being imported (exits.py, line 5)"),
    "unknown module": ("yieldstar_no_such_module", "no module named 'yieldstar_no_such_module'"),
    "bad module name": ("shop workflows", "neither a module name"),
    "duplicate workflow names": ("tests/apps/broken/duplicate_names.py", "workflow 'broken.order' is already registered"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(LOAD_FAILURES))
def test_an_app_that_cannot_be_loaded_is_one_line_naming_it_exit_2_and_creates_no_ledger(case, tmp_path):
    app, cause = LOAD_FAILURES[case]
    app = app or _syntax_error_app(tmp_path)
    db = tmp_path / "ledger.db"
    result = yieldstar("--db", str(db), "supervise", app, "--concurrency", "2")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"yieldstar: cannot load app {app}: "), lines[0]
    assert cause in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert ledger_files(db) == []
    assert not os.path.exists(nudge_dir(str(db)))


@pytest.mark.timeout(60)
def test_supervise_verbose_adds_the_traceback_of_an_app_that_cannot_be_loaded(tmp_path):
    db = tmp_path / "ledger.db"
    result = yieldstar("--db", str(db), "supervise", "tests/apps/broken/raises.py", "--concurrency", "1",
                       "--verbose")
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr and 'raise RuntimeError("SHOP_API_KEY' in result.stderr
    assert result.stderr.splitlines()[-1] == ("yieldstar: cannot load app tests/apps/broken/raises.py:"
                                              " RuntimeError: SHOP_API_KEY is not set (raises.py, line 3)")
    assert ledger_files(db) == []


@pytest.mark.timeout(60)
def test_the_ledger_is_created_only_once_a_worker_has_loaded_the_app_and_the_first_claim_follows(tmp_path,
                                                                                                supervisors):
    db = tmp_path / "new.db"
    started = time.monotonic()
    supervisor = supervisors.start(db, concurrency=1, env={"SV_IMPORT_DELAY_S": "1.5"}, ready=False)
    wait_until(supervisor.loading, message="the template process (or a worker) loading the app")
    assert ledger_files(db) == [], "the ledger was opened before the app was known to load"
    supervisor.wait_log("supervising", timeout=20)
    assert time.monotonic() - started >= 1.5
    with open_backend(db) as backend:
        backend.executions.admit("first", "sv.noop3", "null")
        wait_until(lambda: backend.executions.get("first").status == "completed", timeout=10,
                   message="the first execution to complete")


# -- 2. --input @FILE and --input - -------------------------------------------------------------

@pytest.mark.timeout(60)
def test_start_reads_its_input_from_a_file_or_stdin(tmp_path):
    db = tmp_path / "ledger.db"
    (tmp_path / "order.json").write_text('{"order_id": 42, "items": ["tea"]}\n')
    from_file = cli(db, "start", "shop.order", "--id", "from-file", "--input", f"@{tmp_path / 'order.json'}")
    assert from_file.returncode == 0
    piped = yieldstar("--db", str(db), "start", "shop.order", "--id", "from-stdin", "--input", "-",
                      input="[1, 2]")
    assert piped.returncode == 0, piped.stderr
    with open_backend(db) as backend:
        assert json.loads(backend.executions.get("from-file").input_json) == {"order_id": 42, "items": ["tea"]}
        assert json.loads(backend.executions.get("from-stdin").input_json) == [1, 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["bad JSON in the file", "missing file", "bad JSON on stdin"])
def test_start_with_an_unreadable_input_is_one_line_exit_2_and_admits_nothing(how, tmp_path, db_snapshot):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("existing", "shop.order", "null")
    before = db_snapshot(db)
    (tmp_path / "bad.json").write_text("{order_id: 42}")
    if how == "bad JSON on stdin":
        result = yieldstar("--db", str(db), "start", "shop.order", "--input", "-", input="{oops")
        expected = "yieldstar: --input (from stdin) is not valid JSON"
    else:
        name = "bad.json" if how == "bad JSON in the file" else "missing.json"
        result = cli(db, "start", "shop.order", "--input", f"@{tmp_path / name}")
        expected = (f"yieldstar: --input (from {tmp_path / name}) is not valid JSON" if name == "bad.json"
                    else f"yieldstar: --input @{tmp_path / name}: No such file or directory")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(expected), result.stderr
    assert db_snapshot(db) == before


# -- 3. --version -------------------------------------------------------------------------------

def test_version_prints_the_package_version():
    result = yieldstar("--version")
    assert result.returncode == 0
    assert result.stdout == f"yieldstar {importlib.metadata.version('yieldstar')}\n"


# -- 4. a closed pipe ---------------------------------------------------------------------------

def _piped_to_head(db: Path, *args: str) -> tuple[int, str, str]:
    """`yieldstar --db DB ARGS | head -1`, with real processes: (yieldstar's exit, head's output, stderr)."""
    producer = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", str(db), *args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    head = subprocess.Popen(["head", "-1"], stdin=producer.stdout, stdout=subprocess.PIPE)
    producer.stdout.close()  # head alone holds the read end: when it exits, the pipe is closed
    first, _ = head.communicate(timeout=60)
    stderr = producer.stderr.read().decode()
    producer.stderr.close()
    return producer.wait(timeout=60), first.decode(), stderr


@pytest.mark.timeout(120)
def test_output_piped_to_head_ends_quietly(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        for i in range(3000):  # megabytes of output: far more than a pipe holds
            backend.executions.admit(f"order-{i:05d}", "shop.order", json.dumps({"note": "x" * 200}))
            backend.stores.set(f"store-{i:05d}", json.dumps({"note": "x" * 200}))
    for args in (("store", "ls"), ("ls", "--limit", "3000"), ("ls", "--json", "--limit", "3000")):
        code, first, stderr = _piped_to_head(db, *args)
        assert stderr == "", (args, stderr)
        assert first.count("\n") == 1
        # 141 (128 + SIGPIPE) when a write met the closed pipe; 0 when it all went into the pipe first
        assert code in (0, 141), (args, code)
    code, first, _ = _piped_to_head(db, "store", "ls")
    assert code == 141 and first.startswith("store-00000")


# -- 5. one style, one exit code ---------------------------------------------------------------

USAGE_ERRORS = {
    "unknown option": (("ls", "--bogus"), "yieldstar: no such option '--bogus' (see yieldstar ls --help)"),
    "missing argument": (("start",), "yieldstar: missing argument 'WORKFLOW' (see yieldstar start --help)"),
    "bad choice": (("supervise", APP, "--durability", "sometimes"),
                   ("yieldstar: invalid value for '--durability': 'sometimes' is not one of 'normal', 'full'"
                    " (see yieldstar supervise --help)")),
    "bad number": (("supervise", APP, "--concurrency", "many"), "yieldstar: invalid value for '--concurrency': "),
    "unknown command": (("lss",), "yieldstar: no such command 'lss'"),
    "missing option": (("settle", "effect-1"), "yieldstar: missing option '--result' (see yieldstar settle --help)"),
    "unknown option of a subgroup": (("store", "ls", "--bogus"),
                                     "yieldstar: no such option '--bogus' (see yieldstar store ls --help)"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_a_usage_error_is_one_line_in_the_house_style_with_exit_2(case, tmp_path):
    args, expected = USAGE_ERRORS[case]
    result = yieldstar("--db", str(tmp_path / "ledger.db"), *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(expected), result.stderr
    assert "Usage:" not in result.stderr and "Error:" not in result.stderr
    assert ledger_files(tmp_path / "ledger.db") == []


@pytest.mark.timeout(60)
def test_errors_of_every_kind_share_the_style_and_their_exit_code(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("known", "shop.order", "null")
    for args, code in ((("get", "unknown"), 1), (("steps", "unknown"), 1), (("store", "get", "nothing"), 1),
                       (("start", "shop.order", "--input", "{x"), 2), (("wake", "known", "--at", "soon-ish"), 2)):
        result = cli(db, *args)
        assert result.returncode == code, (args, result)
        assert result.stderr.startswith("yieldstar: ") and result.stderr.count("\n") == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


def _blocked_reading_stdin(pid: int) -> bool:
    """Whether the process waits in a read of a pipe on its fd 0: stdin (the syscall's first
    argument), not another pipe it may read on the way there."""
    try:
        waiting = "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return waiting and len(call) > 1 and call[1] == "0x0"


@pytest.mark.timeout(60)
def test_ctrl_c_exits_130_quietly_and_admits_nothing(tmp_path):
    db = tmp_path / "ledger.db"
    # SIGINT as a terminal gives it: a suite run in the background of a shell inherits it ignored,
    # and so would the command (Python then raises no KeyboardInterrupt, and it reads an empty stdin).
    command = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", str(db), "start", "shop.order",
                                "--input", "-"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: _blocked_reading_stdin(command.pid), message="start waiting for its input on stdin")
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=30)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 130, err
    assert (out, err) == (b"", b"")
    assert ledger_files(db) == []


def test_the_exit_codes_are_documented_for_operators():
    text = (ROOT / "docs" / "operators.md").read_text()
    section = text[text.index("## Exit codes"):]
    section = section[: section.index("\n## ", 3)]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 5 |", "| 130 |", "| 141 |"):
        assert code in section, code
    import supervisor.cli as cli_module
    for code in ("- 130:", "- 141:", "- 2: bad input"):
        assert code in cli_module.__doc__, code


# -- 6. stale nudge sockets ---------------------------------------------------------------------

def _stale_socket(path: Path) -> None:
    """A socket file nobody listens on: what a supervisor killed by SIGKILL leaves behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.close()


@pytest.mark.timeout(90)
def test_a_starting_supervisor_removes_the_sockets_of_dead_supervisors(sqlite_path, tmp_path, supervisors):
    killed = supervisors.start(sqlite_path, concurrency=1)
    folder = Path(nudge_dir(str(sqlite_path)))
    dead_socket = folder / f"{killed.pid}.sock"
    assert dead_socket.exists()
    pids = [killed.pid, *killed.workers()]
    killed.kill_everything()  # SIGKILL: it cannot remove its socket
    wait_gone(pids)
    assert dead_socket.exists()
    for n in range(50):  # a folder of nothing but stale sockets does not grow
        _stale_socket(folder / f"{4_000_000 + n}.sock")
    (folder / "not-ours.txt").write_text("left alone")

    survivor = supervisors.start(sqlite_path, concurrency=1)
    live_socket = folder / f"{survivor.pid}.sock"
    assert sorted(p.name for p in folder.iterdir()) == sorted([live_socket.name, "not-ours.txt"])
    assert cli(sqlite_path, "start", "sv.noop3", "--id", "after").returncode == 0  # and it is still nudged
    survivor.wait_log("delivery execution=after token=1 outcome=completed")


# -- 7. --db help -------------------------------------------------------------------------------

@pytest.mark.parametrize("env_value", [None, "/srv/shop/ledger.db"])
def test_db_help_shows_the_default_in_effect(env_value):
    env = {k: v for k, v in os.environ.items() if k != "YIELDSTAR_DB"}
    env["COLUMNS"] = "200"
    if env_value:
        env["YIELDSTAR_DB"] = env_value
    shown = " ".join(yieldstar("--help", env=env).stdout.split())
    expected = f"[default: {env_value} (from $YIELDSTAR_DB)]" if env_value else "[default: ./yieldstar.db]"
    assert expected in shown, shown


# -- 8. the README's unit test ------------------------------------------------------------------

def test_the_readme_unit_test_says_it_needs_the_test_extras():
    text = (ROOT / "README.md").read_text()
    paragraph = text[text.index("Unit-test a workflow"): text.index("```python\n# test_shop.py")]
    assert "pip install -e '.[test]'" in paragraph and "pytest" in paragraph


# -- 9. chaos explains itself -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(120)
def test_chaos_explains_its_progress_line_and_says_where_it_wrote_the_report_and_its_page(tmp_path):
    work = tmp_path / "chaos"
    page = tmp_path / "pages" / "run.html"
    result = yieldstar("chaos", "--seed", "3", "--duration", "1", "--supervisors", "1", "--concurrency", "2",
                       "--executions", "5", "--faults", "none", "--drain-timeout", "60", "--workdir", str(work),
                       "--html", str(page), timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    legend = [line for line in lines if line.startswith("progress: ")]
    assert len(legend) == 1 and "kc kill_child" in legend[0] and "ck clock_skew" in legend[0], lines
    assert lines.index(legend[0]) < next(i for i, line in enumerate(lines) if line.startswith("["))
    assert lines[-3:] == [f"report   {work / 'report.json'}", f"summary  {work / 'summary.txt'}",
                          f"page     {page}"], lines[-4:]
    assert json.loads((work / "report.json").read_text())["ok"] is True
    assert "RESULT: PASS" in (work / "summary.txt").read_text()
    assert '<span class="verdict pass">PASS</span>' in page.read_text()


# -- 10. settle needs an effect that has begun --------------------------------------------------

@pytest.mark.timeout(60)
def test_settle_of_an_effect_nobody_began_is_refused_unless_created(tmp_path, db_snapshot):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.effects.begin("charge-begun")
    before = db_snapshot(db)

    refused = cli(db, "settle", "charge-typo", "--result", '{"ok": true}')
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--create" in refused.stderr and "charge-typo" in refused.stderr
    assert db_snapshot(db) == before

    assert cli(db, "settle", "charge-begun", "--result", '{"ok": true}').returncode == 0
    created = cli(db, "settle", "charge-early", "--result", '{"ok": 1}', "--create")
    assert created.returncode == 0, created.stderr
    with open_backend(db) as backend:
        assert json.loads(backend.effects.get("charge-early").result_json) == {"ok": 1}
        assert json.loads(backend.effects.get("charge-begun").result_json) == {"ok": True}
    assert not ledger_files(tmp_path / "none.db") and cli(tmp_path / "none.db", "settle", "x", "--result", "1"
                                                           ).returncode == 2
    assert ledger_files(tmp_path / "none.db") == []


# -- 11. a live status line on a terminal -------------------------------------------------------

class Terminal:
    """The master end of a pseudo-terminal, read all along (a full one would block the writer)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.1)
                if ready:
                    chunk = os.read(self.master, 65536)
                    if not chunk:
                        return
                    with self._lock:
                        self._chunks.append(chunk)
            except OSError:  # the slave side closed (EIO): nothing more to read
                return

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def close(self) -> None:
        os.close(self.slave)
        self._thread.join(5)
        os.close(self.master)


@pytest.mark.timeout(90)
def test_supervise_shows_a_live_status_line_on_a_terminal_and_plain_log_lines_above_it(sqlite_path, tmp_path):
    for i in range(3):
        admit(sqlite_path, f"quick-{i}", "sv.noop3")
    terminal = Terminal()
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", str(sqlite_path), "supervise", APP,
                                   "--concurrency", "2", "--poll-ms", "100"], cwd=tmp_path,
                                  stdin=subprocess.DEVNULL, stdout=terminal.slave, stderr=terminal.slave,
                                  start_new_session=True)
    try:
        status = wait_until(lambda: re.search(r"\rclaimed 3  done 3  failed 0  running 0", terminal.text()),
                            timeout=30, message="the status line to show 3 done")
        assert status
        assert re.search(r"\rclaimed \d+  done [1-9]", terminal.text())
        redraws = terminal.text().count("\rclaimed ")
        wait_until(lambda: terminal.text().count("\rclaimed ") >= redraws + 2, timeout=5,
                   message="the status line to be redrawn about twice a second")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
        terminal.close()
    text = terminal.text().replace("\r\n", "\n")  # the terminal turns each newline into CR LF
    log_lines = [segment.rstrip() for line in text.split("\n") for segment in line.split("\r")
                 if "yieldstar[" in segment]
    deliveries = [line for line in log_lines if "delivery execution=" in line]
    assert len(deliveries) == 3
    for line in log_lines:  # each log line whole, never cut by the status line
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} yieldstar\[\d+\] [^\r]+", line), line
        assert "claimed " not in line
    assert "\rclaimed 3  done 3  failed 0  running 0  workers 2/2 up" in text  # how many workers are up
    # The last status is kept: after the stop, no worker is up.
    assert text.rstrip(" ").endswith("claimed 3  done 3  failed 0  running 0  workers 0/2 up\n")


@pytest.mark.timeout(60)
def test_supervise_writes_plain_log_lines_when_not_on_a_terminal(sqlite_path, supervisors):
    admit(sqlite_path, "quick", "sv.noop3")
    supervisor = supervisors.start(sqlite_path, concurrency=1)
    supervisor.wait_log("delivery execution=quick token=1 outcome=completed")
    assert "\r" not in supervisor.log() and "claimed " not in supervisor.log()

