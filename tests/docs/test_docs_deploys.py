"""docs/deploys.md shows real output: its console blocks are one session on a fresh ledger, the
apps being the document's python blocks, replayed here in order as tests/docs/test_docs_operators.py
replays the operators' guide. When an output changes on purpose, rewrite the document's outputs
from a new run with

    .venv/bin/python tests/docs/test_docs_deploys.py --update
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_docs_operators import ROOT, Command, assert_replayed, code_block, run, session, with_outputs  # noqa: E402

DEPLOYS = ROOT / "docs" / "deploys.md"
APPS = ("shop.py", "shop_v2.py", "shop_v3.py", "shop_v4.py")


def deploys_folder(base: Path) -> Path:
    folder = base / "deploys"
    folder.mkdir()
    text = DEPLOYS.read_text()
    for app in APPS:
        (folder / app).write_text(code_block(text, f"# {app}"))
    return folder


def replay(text: str, folder: Path) -> list[tuple[Command, str]]:
    """Run the session; `check` exits 1 exactly when its output lists executions that would
    diverge, every other command 0 unless the document shows an error."""
    done = []
    for command in session(text):
        output, code = (check(command.line, folder) if command.line.startswith("yieldstar check")
                        else run(command.line, folder))
        if command.line.startswith("yieldstar check"):
            expected = 0 if "would diverge: none" in output else 1
        else:
            expected = 1 if command.shown.startswith("yieldstar: ") else 0
        assert code == expected, f"$ {command.line}\nexit {code}:\n{output}"
        done.append((command, output))
    return done


def check(line: str, folder: Path) -> tuple[str, int]:
    """`yieldstar check APP` in a process of its own, as a user runs it: it imports APP, whose
    workflows would clash in this process's registry with the other versions'."""
    env = {k: v for k, v in os.environ.items() if k != "YIELDSTAR_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", *shlex.split(line)[1:]], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr, done.returncode


@pytest.mark.timeout(120)
def test_the_deploys_guide_shows_the_real_output_of_every_command(tmp_path):
    done = replay(DEPLOYS.read_text(), deploys_folder(tmp_path))
    outputs = {command.line: output for command, output in done}
    # The story the guide tells, whatever the wording: v2 would diverge on both orders, v3 on
    # none; the parked order completes under v3 on its old path; v4 waits for order-2.
    assert "would diverge: 2" in outputs["yieldstar check shop_v2.py"]
    assert "would diverge: none" in outputs["yieldstar check shop_v3.py"]
    assert '"status": "completed"' in outputs["yieldstar get order-1 --json | python3 -m json.tool"]
    assert re.search(r"@0:patch:stock-by-warehouse\s+attempt=1\s+done=true", outputs["yieldstar steps order-3"])
    checks_of_v4 = [output for command, output in done if command.line == "yieldstar check shop_v4.py"]
    assert "order-2" in checks_of_v4[0] and "would diverge: none" in checks_of_v4[1]
    assert_replayed(done)


def update() -> None:
    text = DEPLOYS.read_text()
    with tempfile.TemporaryDirectory() as base:
        text = with_outputs(text, replay(text, deploys_folder(Path(base))))
    DEPLOYS.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
