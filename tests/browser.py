"""Debian's headless Chromium, for the tests that look at a page as a browser draws it (the web
UI's, the chaos report's). Needs `chromium` on PATH (`apt-get install -y chromium`): a test module
marks itself with `needs_chromium` and is skipped, saying so, without it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install -y chromium")

# No first-run work, no network of its own, no sandbox (tests run as root in CI).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium(tmp_path, *args: str) -> str:
    """Run Chromium with `args` (`--dump-dom URL`, `--screenshot=FILE URL`...), a profile of its
    own under `tmp_path`; its standard output."""
    profile = tmp_path / "chromium-profile"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
