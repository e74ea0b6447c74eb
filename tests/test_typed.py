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

pytestmark = pytest.mark.timeout(300)  # a build and a mypy run: about 4 s

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("# shop.py", "# place_order.py")


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


def test_mypy_passes_the_readme_examples_against_an_installed_package(tmp_path):
    site = install(tmp_path)
    assert (site / "worker" / "py.typed").is_file() and (site / "supervisor" / "py.typed").is_file()
    readme = (ROOT / "README.md").read_text()
    examples = tmp_path / "examples"
    examples.mkdir()
    for first_line in EXAMPLES:
        (examples / first_line[2:]).write_text(code_block(readme, first_line))

    env = {**os.environ, "PYTHONPATH": str(site)}
    checked = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"),
                              "shop.py", "place_order.py"],
                             cwd=examples, env=env, capture_output=True, text=True, timeout=240)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 2 source files" in checked.stdout
