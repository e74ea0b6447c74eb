"""The CLI's error style where the first audit of issue 11 found it uneven: Ctrl-C on `chaos`
exits 130 like every other command, and `wake`, `supervise FOLDER`, `--db` without a value
and `steps` of a failed step say what they should, the way their neighbours do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from faults import ROOT, cli, process_tree, wait_gone, wait_until
from supervisor import open_backend


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    """The message of a failed command, checked to be one `yieldstar: ...` line on stderr, no
    traceback, and the exit code `code`."""
    assert result.returncode == code, result
    assert result.stderr.startswith("yieldstar: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr[len("yieldstar: "):].rstrip("\n")


# -- Ctrl-C on chaos ----------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_ctrl_c_on_chaos_exits_130_with_one_line_naming_the_phase_and_the_work_folder(tmp_path):
    workdir = tmp_path / "work"
    out, err = open(tmp_path / "out", "w+"), open(tmp_path / "err", "w+")
    command = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "chaos", "--duration", "60", "--executions", "20",
         "--supervisors", "1", "--concurrency", "1", "--faults", "none", "--workdir", str(workdir)],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    try:
        wait_until(lambda: "[faults" in (tmp_path / "out").read_text(), timeout=30,
                   message="the chaos run's fault phase to start")
        started = [p.pid for p in process_tree(command.pid)]
        assert started  # its supervisor, at least
        os.killpg(command.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        command.wait(60)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()
        out.close()
        err.close()
    result = subprocess.CompletedProcess(command.args, command.returncode, (tmp_path / "out").read_text(),
                                         (tmp_path / "err").read_text())
    message = one_line_error(result, 130)
    assert message == (f"stopped by SIGINT during the faults phase; the work folder {workdir} holds what happened"
                       " so far")
    wait_gone(started)  # everything it started was stopped with it


def test_the_documented_exit_codes_name_the_commands_that_do_not_exit_130_on_ctrl_c():
    import supervisor.cli as cli_module

    text = (ROOT / "docs" / "operators.md").read_text()
    section = text[text.index("## Exit codes"):]
    row_130 = next(line for line in section.splitlines() if line.startswith("| 130 |"))
    doc_130 = cli_module.__doc__[cli_module.__doc__.index("- 130:"):cli_module.__doc__.index("- 141:")]
    for where in (row_130, doc_130):
        assert "`supervise`" in where and "`top`" in where and "`chaos`" in where, where


# -- the same message for the same error --------------------------------------------------------

@pytest.mark.timeout(60)
def test_wake_of_an_unknown_execution_says_no_execution_like_get_and_cancel(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("known", "shop.order")
    for command in ("get", "steps", "history", "cancel", "resume", "wake"):
        assert one_line_error(cli(db, command, "nobody"), 1) == "no execution 'nobody'", command
    assert cli(db, "wake", "known", "--at", "30s").returncode == 0


@pytest.mark.timeout(60)
def test_supervise_of_a_folder_says_it_is_a_folder_and_creates_no_ledger(tmp_path):
    db = tmp_path / "ledger.db"
    folder = tmp_path / "shop"
    folder.mkdir()
    for app in (str(folder), f"{folder}/"):
        message = one_line_error(cli(db, "supervise", app), 2)
        assert message == f"cannot load app {app}: {folder} is a folder, not a Python file (give a .py file's path" \
                          " or a module name)"
    assert not db.exists()
    message = one_line_error(cli(db, "supervise", str(tmp_path / "missing.py")), 2)
    assert message.endswith(f"app file {tmp_path / 'missing.py'} does not exist")


@pytest.mark.timeout(60)
def test_a_missing_value_of_a_global_option_is_a_usage_error_with_the_hint(tmp_path):
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "--db"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert one_line_error(result, 2) == "option '--db' requires an argument (see yieldstar --help)"


FAILING_APP = '''
from worker import workflow

def boom():
    raise ValueError("bad value")

@workflow("fails")
def fails(ctx, input):
    ctx.run("ok", lambda: 1)
    ctx.run("boom", boom)
'''


@pytest.mark.timeout(60)
def test_steps_shows_a_failed_steps_traceback_as_lines_and_json_keeps_it_whole(tmp_path):
    db = tmp_path / "ledger.db"
    (tmp_path / "failing_app.py").write_text(FAILING_APP)
    assert cli(db, "start", "fails", "--id", "f1").returncode == 0
    run = cli(db, "supervise", str(tmp_path / "failing_app.py"), "--until-idle", "--poll-ms", "50", "--quiet")
    assert run.returncode == 0, run.stderr

    lines = cli(db, "steps", "f1").stdout.splitlines()
    assert lines[0] == 'ok\tattempt=1\tdone=true\t{"value": 1}'
    assert lines[1] == 'boom\tattempt=1\tdone=true\t{"error": {"type": "ValueError", "message": "bad value"},' \
                       ' "retry_at": null}'
    assert lines[2] == "    Traceback (most recent call last):"
    assert '        raise ValueError("bad value")' in lines[3:]  # the traceback's lines, indented under the step
    assert lines[-1] == "    ValueError: bad value"
    assert not any("\\n" in line for line in lines)

    boom = json.loads(cli(db, "steps", "f1", "--json").stdout)[1]["step_response"]["error"]
    assert boom["traceback"].startswith("Traceback (most recent call last):\n")
    assert boom["traceback"].endswith("ValueError: bad value\n")


# -- ids that mean nothing, times the ledger cannot hold ----------------------------------------

@pytest.mark.timeout(60)
def test_a_blank_id_and_a_time_the_ledger_cannot_hold_are_refused_naming_them_and_change_nothing(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("known", "shop.order")
    assert one_line_error(cli(db, "start", "shop.order", "--id", " "), 2) == (
        "--id ' ' is blank: it needs a character other than a space (see yieldstar start --help)")
    for at in ("99999999999d", "253402300800000", "0001-01-01"):
        message = one_line_error(cli(db, "wake", "known", "--at", at), 2)
        assert message.startswith(f"--at {at!r} is outside the times the ledger holds: 0 (1970-01-01T00:00:00Z) to"
                                  " 253402300799999 (9999-12-31T23:59:59.999Z)"), message
    assert one_line_error(cli(db, "ls", "--since", "99999999999d"), 2).startswith("--since '99999999999d' is outside")
    with open_backend(db) as backend:
        assert [r.execution_id for r in backend.executions.list()] == ["known"]
        assert backend.executions.get("known").due_at is not None  # due as admitted, not moved by a wake


@pytest.mark.timeout(60)
def test_json_the_ledger_would_refuse_is_refused_by_the_cli_naming_the_users_option_or_argument(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db):
        pass
    assert one_line_error(cli(db, "start", "shop.order", "--id", "o-1", "--input", "NaN"), 2) == (
        "--input is not valid JSON: NaN is not a JSON value (JSON has no NaN or Infinity)")
    assert one_line_error(cli(db, "store", "put", "mailbox", '{"a": Infinity}'), 2) == (
        "ITEM is not valid JSON: Infinity is not a JSON value (JSON has no NaN or Infinity)")
    assert one_line_error(cli(db, "store", "set", "counter", "{"), 2).startswith("STATE is not valid JSON: ")
    with open_backend(db) as backend:
        assert backend.executions.get("o-1") is None and backend.stores.list() == []
