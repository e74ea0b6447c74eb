"""The CLI's error style where the first audit of issue 11 found it uneven: Ctrl-C on `chaos`
exits 130 like every other command, and `wake`, `supervise FOLDER`, `--db` without a value
and `steps` of a failed step say what they should, the way their neighbours do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults import ROOT, cli, process_tree, wait_gone, wait_until
from supervisor import Failed, open_backend


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
