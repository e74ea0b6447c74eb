"""An app's folder may hold files named like yieldstar's own packages.

`supervise` is often started from the app's folder, and a folder of workflows may well hold a
`worker.py` or a `supervisor.py`. The workers import yieldstar's packages before anything of the
app's can be found, so such files never take their place; and an app that imports one of them
under that name (`from worker import ...` meaning its own file) is told so, the file named,
instead of workers dying while they load it. Each test runs `yieldstar supervise` as a user
does: the console script, from the app's folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from faults import cli

pytestmark = pytest.mark.timeout(90)

# The console script, as a user runs it: `python -m supervisor.cli` from the app's folder would
# import the folder's own supervisor.py itself, as Python puts the working folder first for -m.
YIELDSTAR = Path(sys.executable).parent / "yieldstar"

OWN_FILE = 'raise RuntimeError("{name} of the app\'s folder was imported in yieldstar\'s place")\n'


def app_folder(tmp_path: Path, app: str, *, worker: str | None = None) -> Path:
    """A folder holding the app `shop.py` and files of its own called worker.py and supervisor.py."""
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "shop.py").write_text(app)
    (folder / "worker.py").write_text(worker if worker is not None else OWN_FILE.format(name="worker.py"))
    (folder / "supervisor.py").write_text(OWN_FILE.format(name="supervisor.py"))
    return folder


def supervise(folder: Path, db: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(YIELDSTAR), "--db", str(db), "supervise", "shop.py", "--concurrency", "2",
                           "--until-idle"], cwd=folder, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def console_script():
    if not YIELDSTAR.exists():
        pytest.skip("the yieldstar console script is not installed")


def test_an_app_folder_with_its_own_worker_py_and_supervisor_py_is_supervised(tmp_path):
    folder = app_folder(tmp_path, 'from worker import workflow\n\n\n'
                                  '@workflow("shop.hello")\n'
                                  'def hello(ctx, input):\n'
                                  '    return {"hello": input}\n')
    db = tmp_path / "ledger.db"
    started = cli(db, "start", "shop.hello", "--id", "one", "--input", '"there"')
    assert started.returncode == 0, started.stderr
    result = supervise(folder, db)
    assert result.returncode == 0, result.stderr
    record = json.loads(cli(db, "get", "one", "--json").stdout)
    assert (record["status"], record["result"]) == ("completed", {"hello": "there"}), record


@pytest.mark.parametrize("use, own", [
    ("from worker import greeting", "worker.py"),
    ("import worker\nGREETING = worker.greeting", "worker.py"),
    ("import worker.greetings", "worker.py"),
    ("from supervisor import settings", "supervisor.py"),
])
def test_an_app_importing_its_own_worker_py_is_told_that_yieldstars_package_takes_the_name(tmp_path, use, own):
    folder = app_folder(tmp_path, f"from worker import workflow\n{use}\n", worker='greeting = "hi"\n')
    db = tmp_path / "ledger.db"
    result = supervise(folder, db)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("yieldstar: cannot load app shop.py: "), line
    assert f"(shop.py, line {use.count(chr(10)) + 2}): {folder / own} cannot be imported as {own[:-3]!r}," \
           " which is yieldstar's own package; rename it" in line, line
