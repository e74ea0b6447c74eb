"""The packages are typed for their users (PEP 561): mypy checks the README's `shop.py` and
`place_order.py` against a copy of the packages installed as a user installs them.

Not against this checkout: mypy does not follow the import hook of an editable install, and
would find the sources here even without the `py.typed` markers a wheel must ship.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_operators import code_block

pytestmark = pytest.mark.timeout(300)  # a build and three mypy runs: about 8 s

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("# shop.py", "# place_order.py")

# A user who annotates: `@workflow` keeps the function's own type, and every call here is typed.
ANNOTATED = """\
from typing import Any

from worker import Client, RetryPolicy, WorkflowContext, WorkflowFailed, workflow


@workflow("typed.order")
def order(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
    total = ctx.run("total", sum, input["amounts"], retry=RetryPolicy(max_attempts=5, interval=0.5))
    ctx.sleep("cool-off", 5)
    return {"total": total}


def place(path: str) -> Any:
    with Client(path) as client:
        handle = client.start(order, {"amounts": [1, 2]}, id="typed-1")
        status: str = handle.status()
        print(status, order.__name__)
        try:
            return handle.result(timeout=30.0)
        except WorkflowFailed as failed:
            return failed.error
"""


def install(tmp_path: Path) -> Path:
    """`pip install --target` of a copy of the project (a build in place would write to the
    checkout); the build's own requirements come from the configured package index."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("supervisor", "worker"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(source)], check=True, capture_output=True, text=True, timeout=240)
    return site


def mypy(tmp_path: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    """mypy on files in tmp_path/examples, finding the packages installed in `site` alone."""
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"), *args],
                          cwd=tmp_path / "examples", env={**os.environ, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=240)


def test_mypy_passes_the_readme_examples_and_annotated_code_against_an_installed_package(tmp_path):
    site = install(tmp_path)
    assert (site / "worker" / "py.typed").is_file() and (site / "supervisor" / "py.typed").is_file()
    readme = (ROOT / "README.md").read_text()
    examples = tmp_path / "examples"
    examples.mkdir()
    for first_line in EXAMPLES:
        (examples / first_line[2:]).write_text(code_block(readme, first_line))
    (examples / "annotated.py").write_text(ANNOTATED)
    (examples / "misspelt.py").write_text("from worker import RetryPolicy\n\nRetryPolicy(maximum_attempts=3)\n")

    readme_examples = mypy(tmp_path, site, "shop.py", "place_order.py")
    annotated = mypy(tmp_path, site, "--strict", "annotated.py")
    misspelt = mypy(tmp_path, site, "misspelt.py")

    assert readme_examples.returncode == 0, readme_examples.stdout + readme_examples.stderr
    assert "Success: no issues found in 2 source files" in readme_examples.stdout
    assert annotated.returncode == 0, annotated.stdout + annotated.stderr
    assert 'Unexpected keyword argument "maximum_attempts"' in misspelt.stdout, misspelt.stdout
